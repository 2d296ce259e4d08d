"""Step gather: the Triton mixed-source gather, bit-exact vs the torch reference, timed vs
``index_copy_`` (one per source/destination pair, as SGLang's per-layer copies) in the same run.

Plans: ``fa`` (full-attention K/V rows from SSD staging and the host pool) and ``mixed``
(the same plus GDN conv and fp32 recurrent states). Timed with every source on the device;
one more case reads the host-pool rows from pinned memory over UVA (bit-exactness only).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from sglang_saria.gpukit.steps.common import StepContext, check, require_cuda
from sglang_saria.gpukit.timing import gbps, median_seconds, sig
from sglang_saria.gpukit.workloads import ModelShape, Workload, build_workload, same_bits, snapshot
from sglang_saria.kernels.gather import GatherPlan, gather_mixed

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TINY = ModelShape(fa_layers=2, kv_heads=1, head_dim=8, gdn_layers=2, conv_dim=16, conv_width=2, value_heads=1, state_dim=4, page_size=4)


def index_copy(w: Workload):
    """The baseline: per move, ``dst.index_copy_(0, dst_rows, src.index_select(0, src_rows))``."""
    idx = [
        (torch.as_tensor(m.src_rows).to(w.sources[m.src].device), torch.as_tensor(m.dst_rows).to(w.destinations[m.dst].device))
        for m in w.moves
    ]

    def run() -> None:
        for m, (src_rows, dst_rows) in zip(w.moves, idx):
            w.destinations[m.dst].index_copy_(0, dst_rows, w.sources[m.src].index_select(0, src_rows).to(dst_rows.device))

    return run


def exact_case(w: Workload) -> tuple[GatherPlan, bool]:
    """Run kernel and reference on zeroed pools; True when both wrote the same, non-zero bits."""
    plan = GatherPlan.from_rows(w.sources, w.destinations, w.moves)
    outputs = []
    for backend in ("triton", "torch"):
        for t in w.destinations:
            t.zero_()
        check(gather_mixed(plan, w.sources, w.destinations, backend=backend) == backend, f"{backend} did not run")
        if w.destinations[0].is_cuda:
            torch.cuda.synchronize()
        outputs.append(snapshot(w))
    wrote = any(bool(t.view(torch.uint8).any()) for t in outputs[0])
    return plan, wrote and same_bits(outputs[0], outputs[1])


def run(ctx: StepContext) -> dict:
    if ctx.cuda:
        require_cuda()
        shape, tokens, repeats = ModelShape(), 4096, 7
    else:
        shape, tokens, repeats = TINY, 16, 1  # times the interpreter: exercises the code, not the GPU
        ctx.log("dry run: interpreted kernel, tiny pools; on a GPU host this step times 4096-token plans")
    figures: dict = {}
    for plan_name, plan_shape in (("fa", replace(shape, gdn_layers=0)), ("mixed", shape)):
        for label, dtype in DTYPES.items():
            case = f"{plan_name}-{label}"
            w = build_workload(plan_shape, tokens, dtype, ctx.device, ctx.device, seed=tokens)
            plan, exact = exact_case(w)
            check(exact, f"{case}: the Triton gather's bits differ from the torch reference")
            figures[f"{case}_exact"] = True
            t_kernel = median_seconds(lambda: gather_mixed(plan, w.sources, w.destinations, backend="triton"), repeats, ctx.cuda)
            t_base = median_seconds(index_copy(w), repeats, ctx.cuda)
            figures[f"{case}_gbps"] = sig(gbps(plan.total_bytes, t_kernel))
            figures[f"{case}_index_copy_gbps"] = sig(gbps(plan.total_bytes, t_base))
            figures[f"{case}_vs_index_copy"] = sig(t_base / t_kernel)
            ctx.log(f"{case}: {plan.num_segments} segments, {plan.total_bytes / 2**20:.2f} MiB, "
                    f"{figures[f'{case}_vs_index_copy']}x index_copy_")
    if ctx.cuda:  # DRAM rows straight from pinned host memory, as SGLang's host pool is
        w = build_workload(shape, tokens, torch.bfloat16, "cuda", "cpu", seed=1)
        check(exact_case(w)[1], "mixed-bf16 with pinned host-pool sources: kernel bits differ from the reference")
        figures["pinned_host_sources_exact"] = True
    return figures
