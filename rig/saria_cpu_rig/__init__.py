"""CPU test rig: what SGLang 0.5.23 needs to serve the tiny test models on a CPU-only machine.

Not part of the product. `scripts/setup.sh` installs it (and applies `patches/`) only in its CPU
mode; `scripts/setup.sh --gpu` and `pip install sglang-saria` never do. Every edit of SGLang's
files the project keeps is one of this package's patches, listed in `rig/README.md`.
"""
