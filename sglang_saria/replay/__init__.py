"""Trace replay: the Saria decisions driven over simulated tiers by a logical clock (paper 5.1)."""
