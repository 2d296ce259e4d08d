"""Hybrid (full attention + GDN) model support: the tiny hybrid config for tests and benchmarks; the GDN gather is in `kernels/gather.py`."""
