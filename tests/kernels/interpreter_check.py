"""Run the gather kernel under the Triton interpreter and print one JSON result per case.

Started by test_gather_triton.py in a fresh interpreter: TRITON_INTERPRET=1 only takes
effect if set before triton is imported, which the pytest process may already have done.
"""

from __future__ import annotations

import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("interpreter_check.py needs TRITON_INTERPRET=1 in its environment")

import torch  # noqa: E402
from tests.kernels.gather_cases import ReloadCase, bit_exact, make_reload_case  # noqa: E402

from sglang_saria.kernels.gather import (  # noqa: E402
    GatherPlan,
    RowMoves,
    gather_mixed,
    gather_mixed_reference,
    triton_interpreted,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def run_case(name: str, case: ReloadCase, max_segment_bytes: int) -> dict:
    plan = case.plan(max_segment_bytes=max_segment_bytes)
    expected = case.expected()
    backend = gather_mixed(plan, case.sources, case.destinations)
    kernel_out = [t.clone() for t in case.destinations]
    case.reset()
    gather_mixed_reference(plan, case.sources, case.destinations)
    return {
        "case": name,
        "backend": backend,
        "interpreted": triton_interpreted(),
        "segments": plan.num_segments,
        "alignment": plan.alignment,
        "bytes": plan.total_bytes,
        "kernel_matches_oracle": bit_exact(kernel_out, expected),
        "kernel_matches_reference": bit_exact(kernel_out, case.destinations),
        "changed": not bit_exact(kernel_out, case.initial),
    }


def narrow_rows_case(dtype: torch.dtype, row_elems: int, seed: int) -> ReloadCase:
    """Rows whose width is not a multiple of 4 or 8 bytes: forces 2-byte or 1-byte words."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 255, (9, row_elems * dtype.itemsize), generator=gen, dtype=torch.uint8).view(dtype)
    dst = torch.zeros(7, row_elems, dtype=dtype)
    moves = [RowMoves(0, [8, 0, 3], 0, [6, 2, 0])]
    return ReloadCase([src], [dst], moves, [dst.clone()])


def main() -> None:
    print(json.dumps({"case": "interpreted", "value": triton_interpreted()}), flush=True)
    for seed in (0, 1):
        for label, dtype in DTYPES.items():
            # 64-byte chunks split every row and checkpoint: exercises the chunking path too.
            for max_segment_bytes in (64, 4096):
                case = make_reload_case(seed, dtype)
                name = f"mixed-{label}-seed{seed}-chunk{max_segment_bytes}"
                print(json.dumps(run_case(name, case, max_segment_bytes)), flush=True)
    for label, dtype, row_elems in (("fp16x3", torch.float16, 3), ("u8x5", torch.uint8, 5)):
        print(json.dumps(run_case(f"narrow-{label}", narrow_rows_case(dtype, row_elems, 7), 4096)), flush=True)
    # One plan, two launches on different pools of the same geometry (fresh addresses).
    reused = make_reload_case(4, torch.float16)
    plan = reused.plan()
    gather_mixed(plan, reused.sources, reused.destinations)
    fresh = [t.clone() for t in reused.initial]
    gather_mixed(plan, reused.sources, fresh)
    expected = reused.expected()
    print(
        json.dumps(
            {
                "case": "reuse",
                "interpreted": triton_interpreted(),
                "first": bit_exact(reused.destinations, expected),
                "second": bit_exact(fresh, expected),
            }
        ),
        flush=True,
    )
    empty = make_reload_case(3, torch.bfloat16)
    plan = GatherPlan.from_rows(empty.sources, empty.destinations, [])
    backend = gather_mixed(plan, empty.sources, empty.destinations)
    print(
        json.dumps(
            {
                "case": "empty",
                "backend": backend,
                "interpreted": triton_interpreted(),
                "unchanged": bit_exact(empty.destinations, empty.initial),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
