"""Hybrid-model support: GDN checkpoints and the Triton mixed-source gather."""
