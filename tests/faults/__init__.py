"""Faults against a real server (kill -9 under traffic, a full disk, a damaged index, bad
requests), and the injectors the store and server tests share (`injection.py`)."""
