"""CPU enablement for SGLang 0.5.23 code paths that assume CUDA (used by patches/)."""
