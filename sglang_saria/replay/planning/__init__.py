"""``saria-plan``: sweep (replays), recommend (budget and choice), cli (flags and output)."""
