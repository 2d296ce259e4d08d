"""Server benchmarks of agent sessions (Figure 10 on the real server, stock HiCache vs saria) and
their replay twins: the pieces `scripts/bench_fig10.py` and `scripts/bench_vs_hicache.py` share."""
