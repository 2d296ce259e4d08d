"""Saria SSD store (L3): slab files, I/O engines, durability, HiCache storage backend."""
