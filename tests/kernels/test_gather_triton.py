"""The Triton gather kernel: interpreted on CPU (subprocess) and compiled on a CUDA GPU.

Both are checked bit-exactly against the row-by-row oracle and the torch reference:
a gather moves bits, so any difference is a bug (bf16 under the interpreter is stored
as raw uint16, which a tolerance check could hide).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.kernels.gather_cases import bit_exact, make_reload_case

from sglang_saria.kernels.gather import GatherPlan, gather_mixed, gather_mixed_reference

HERE = Path(__file__).resolve().parent
DTYPE_LABELS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.fixture(scope="module")
def interpreter_results(run_interpreted) -> dict[str, dict]:
    """interpreter_check.py's results, run once with TRITON_INTERPRET=1 set before triton is imported."""
    return run_interpreted(HERE / "interpreter_check.py")


def test_every_case_ran_the_kernel_under_the_interpreter(interpreter_results: dict[str, dict]) -> None:
    cases = [r for name, r in interpreter_results.items() if name != "interpreted"]
    assert len(cases) == 3 * 2 * 2 + 2 + 2, sorted(interpreter_results)
    for r in cases:
        assert r["interpreted"] is True, r
        assert r.get("backend", "triton") == "triton", r


@pytest.mark.parametrize("label", DTYPE_LABELS)
def test_interpreted_kernel_is_bit_exact_on_mixed_dram_ssd_fa_gdn_reload(
    interpreter_results: dict[str, dict], label: str
) -> None:
    cases = [r for name, r in interpreter_results.items() if name.startswith(f"mixed-{label}-")]
    assert len(cases) == 4, sorted(interpreter_results)
    for r in cases:
        assert r["backend"] == "triton", r
        assert r["changed"], f"{r['case']}: the gather wrote nothing"
        assert r["kernel_matches_oracle"], r
        assert r["kernel_matches_reference"], r
    # The 64-byte chunk runs split rows into more segments than the 4096-byte ones.
    by_chunk = {r["case"].rsplit("-", 1)[1]: r["segments"] for r in cases if "seed0" in r["case"]}
    assert by_chunk["chunk64"] > by_chunk["chunk4096"]


@pytest.mark.parametrize("case, alignment", [("narrow-fp16x3", 2), ("narrow-u8x5", 1)])
def test_interpreted_kernel_handles_rows_narrower_than_a_word(
    interpreter_results: dict[str, dict], case: str, alignment: int
) -> None:
    r = interpreter_results[case]
    assert r["backend"] == "triton" and r["interpreted"], r
    assert r["alignment"] == alignment
    assert r["kernel_matches_oracle"] and r["kernel_matches_reference"] and r["changed"], r


def test_interpreted_kernel_plan_is_reusable_on_other_pools_of_the_same_geometry(
    interpreter_results: dict[str, dict],
) -> None:
    assert interpreter_results["reuse"] == {"case": "reuse", "interpreted": True, "first": True, "second": True}


def test_interpreted_kernel_empty_plan_leaves_pools_untouched(interpreter_results: dict[str, dict]) -> None:
    assert interpreter_results["empty"] == {"case": "empty", "backend": "triton", "interpreted": True, "unchanged": True}


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPU: compiled Triton kernel")


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("label", DTYPE_LABELS)
def test_compiled_kernel_is_bit_exact_on_gpu(label: str) -> None:
    case = make_reload_case(5, DTYPE_LABELS[label], fa_layers=4, heads=4, head_dim=64, device="cuda")
    plan = case.plan(max_segment_bytes=4096)
    assert gather_mixed(plan, case.sources, case.destinations) == "triton"
    torch.cuda.synchronize()
    assert bit_exact(case.destinations, case.expected())


@needs_cuda
@pytest.mark.gpu
def test_compiled_kernel_reads_pinned_host_pool_and_device_staging_in_one_launch() -> None:
    case = make_reload_case(6, torch.bfloat16, device="cuda")
    # Host-pool groups back to pinned DRAM, as SGLang's host pool is: the kernel reads them over UVA.
    sources = [t.cpu().pin_memory() if i % 2 else t for i, t in enumerate(case.sources)]
    plan = GatherPlan.from_rows(sources, case.destinations, case.moves)
    assert gather_mixed(plan, sources, case.destinations) == "triton"
    torch.cuda.synchronize()
    kernel_out = [t.clone() for t in case.destinations]
    case.reset()
    gather_mixed_reference(plan, sources, case.destinations)
    assert bit_exact(kernel_out, case.destinations)
    assert bit_exact(kernel_out, case.expected())
