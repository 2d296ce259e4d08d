"""The paper's evaluation replayed: each claim's number next to the replay's (docs/fidelity.md).

| module | contents |
|---|---|
| `runs.py` | one replay setup (`Setup`), the runner that caches traces and results (`Runner`), a row (`Row`) |
| `table.py` | Figures 3b, 10, 12, 16, the E3 target, the oracle bound; `saria-fidelity` |
| `figures.py` | Figures 1, 3a, 4, 6, 11, 13, 14, 15 |
| `placement.py` | Figure 10's hybrid rows under both GDN state placements; `saria-hybrid-placement` |
"""
