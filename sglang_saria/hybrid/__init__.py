"""Hybrid-model support: GDN checkpoints on CPU (torch GDN ops, CPU routing, tiny hybrid config); the gather is in `kernels/gather.py`."""
