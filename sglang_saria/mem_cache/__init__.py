"""Saria decisions: metadata tree, admission, write sequencer, reload planning, promotion, coordination, SSD victim order (paper 4.2-4.5)."""
