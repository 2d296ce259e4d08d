"""Audits of a saria server: the bytes of every page moved between tiers (`kv.py`) and every tree node's
tier locations and counters (`tiers.py`), each on when its environment variable is set (../README.md)."""
