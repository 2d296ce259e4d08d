"""Trace replay: the policy core driven by simulated tiers and a logical clock (paper 5.1)."""
