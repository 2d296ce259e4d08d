"""GPU check kit: the store's kvikio path, the compiled Triton gather, the device digest and
the direct reload, checked and measured on a bare GPU host without SGLang (scripts/gpu_kit.sh).

Each step runs in its own process with a time limit (`runner.py`); `--dry-run` runs the
same steps on CPU (POSIX engine, the Triton interpreter, CPU pools) so CI keeps them working.
"""
