"""SGLang HiCache integration of Saria: storage backend, radix cache, admission hooks, audits, metrics (README.md)."""
