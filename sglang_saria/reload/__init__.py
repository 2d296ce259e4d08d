"""Moving a prefix back without SGLang: reload plans, the pending-reload state machine, the worker, the device reloader (README.md)."""
