"""Saria policy core: metadata tree, admission, reload planning, promotion, coordination (paper 4.2-4.5)."""
