"""The kit's steps: one module each, with a ``run(ctx) -> figures`` function (see common.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """A step: its module, its time limit on a GPU host, whether a dry run interprets Triton,
    and what it measures there (a dry run prints this and checks correctness only)."""

    name: str
    timeout_s: int
    interpret: bool
    measures: str

    @property
    def module(self) -> str:
        return f"sglang_saria.gpukit.steps.{self.name}"


# Time limits sum to 7 min 55 s: the whole kit stays inside one 8-minute device command.
STEPS = (
    Step("env", 45, False, "torch/CUDA/Triton/kvikio versions, the GPU, kvikio's GDS or compat mode"),
    Step("store", 90, False, "kvikio store put/get into CUDA tensors: write and read GB/s, read vs a raw kvikio read of the same slab bytes, checksums"),
    Step("queues", 40, False, "kvikio read latency of 8 x 4 MiB into CUDA memory, idle and beside a stream of puts from pinned host memory (median of 7, ratio)"),
    Step("gather", 120, True, "compiled Triton gather (FA and FA+GDN plans, fp16/bf16/fp32): bit-exact vs torch, GB/s vs index_copy_"),
    Step("checksum", 60, True, "device digest of GDS-read pages vs the store's recorded digests, GB/s vs a torch reduction"),
    Step("reload", 120, False, "direct SSD -> CUDA pool vs SSD -> pinned host -> CUDA, link rates, coordinated pacing vs the model"),
)
