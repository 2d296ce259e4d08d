"""Saria SSD store (L3): slab files, I/O engines, durability; the HiCache storage backend on it is in hicache/."""
