"""SGLang HiCache integration of Saria: storage backend, radix cache, admission hooks, reload worker, audits, metrics (README.md)."""
