"""Benchmarks and their replay twins, each a console script (setup.py):

| module | console script | measures |
|---|---|---|
| `fig10.py` (+ `configs.py`, `think_serving.py`, `fig10_replay.py`) | `saria-fig10` | Figure 10 on the real server, every admission policy, and its replay |
| `models.py` | `saria-bench-models` | prefill against store reads of the same tokens' KV, benchmark models |
| `tree.py` | `saria-bench-tree` | SGLang's Python TreeCore (saria's) against its Rust one |
| `storage.py` | `saria-bench-storage` | the store against raw reads and writes of the same bytes |
| `reload.py` | `saria-bench-reload` | direct SSD -> device reload against HiCache's host staging |
| `admission_sweep.py` | `saria-admission-sweep` | admission policies against the clairvoyant frontier |
| `admission_budget.py` | `saria-admission-budget` | `auto` against fixed thresholds, the write budget and the oracle bound |
| `restart_turns.py` | `saria-restart-turns` | turns across a server restart |

`scripts/bench_vs_hicache.py` (stock HiCache against saria) shares `configs.py` with `fig10.py`.
"""
