"""sglang-saria: persistence-aware SSD-backed KV cache for SGLang HiCache (the Saria design)."""

__version__ = "0.1.0"
SGLANG_VERSION = "0.5.23"
