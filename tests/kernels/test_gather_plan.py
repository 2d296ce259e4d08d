"""Plan construction, the torch reference path, and bad-input errors (all in-process, CPU)."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.gather_cases import ReloadCase, bit_exact, make_reload_case

from sglang_saria.kernels.gather import (
    NBYTES,
    GatherPlan,
    RowMoves,
    gather_mixed,
    gather_mixed_reference,
    gather_rows,
    select_backend,
    triton_interpreted,
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16", "fp32"])
def test_reference_matches_row_oracle_on_mixed_dram_ssd_fa_gdn_reload(dtype: torch.dtype) -> None:
    case = make_reload_case(11, dtype)
    expected = case.expected()
    assert not bit_exact(case.destinations, expected), "the case must change the pools"
    gather_mixed_reference(case.plan(), case.sources, case.destinations)
    assert bit_exact(case.destinations, expected)


def test_one_plan_carries_fa_rows_and_gdn_checkpoint_rows_of_different_widths_and_dtypes() -> None:
    case = make_reload_case(12, torch.bfloat16, heads=2, head_dim=8)
    plan = case.plan(max_segment_bytes=1 << 20)
    widths = set(plan.segments[:, NBYTES].tolist())
    fa_row = 2 * 8 * 2  # heads * head_dim * bf16
    conv_row = 3 * 2 * 8 * 3 * 2  # conv_dim * kernel * bf16
    temporal_row = 2 * 8 * 8 * 4  # HV * V * K * fp32
    assert widths == {fa_row, conv_row, temporal_row}


def test_auto_backend_on_cpu_is_the_torch_reference_unless_interpreted() -> None:
    case = make_reload_case(13, torch.float16)
    expected_backend = "triton" if triton_interpreted() else "torch"
    assert select_backend(case.destinations) == expected_backend
    assert gather_mixed(case.plan(), case.sources, case.destinations) == expected_backend
    assert bit_exact(case.destinations, case.expected())


def test_long_gdn_state_rows_are_split_into_chunks_without_changing_the_bytes() -> None:
    state = torch.randn(3, 4, 16, 16)  # one row = 4 KiB of fp32 recurrent state
    pool = torch.zeros(5, 4, 16, 16)
    moves = [RowMoves(0, [2, 0], 0, [4, 1])]
    whole = GatherPlan.from_rows([state], [pool], moves, max_segment_bytes=1 << 20)
    chunked = GatherPlan.from_rows([state], [pool], moves, max_segment_bytes=512)
    assert whole.num_segments == 2 and chunked.num_segments == 2 * 4096 // 512
    assert whole.total_bytes == chunked.total_bytes == 2 * 4096
    gather_mixed_reference(chunked, [state], [pool])
    assert torch.equal(pool[4], state[2]) and torch.equal(pool[1], state[0])
    assert not pool[[0, 2, 3]].any()


def test_alignment_is_the_widest_word_dividing_every_offset() -> None:
    src = torch.zeros(4, 3, dtype=torch.float16)  # 6-byte rows
    plan = GatherPlan.from_rows([src], [torch.zeros(4, 3, dtype=torch.float16)], [RowMoves(0, [1], 0, [2])])
    assert plan.alignment == 2
    wide = torch.zeros(4, 4, dtype=torch.float32)
    assert GatherPlan.from_rows([wide], [wide.clone()], [RowMoves(0, [1], 0, [2])]).alignment == 8


def test_strided_per_layer_views_of_a_staging_buffer_are_gathered_without_copies() -> None:
    staging = torch.randn(4, 3, 2, 2, 8, dtype=torch.bfloat16)  # [rows, layers, k/v, heads, dim]
    k_pool = [torch.zeros(10, 2, 8, dtype=torch.bfloat16) for _ in range(3)]
    sources = [staging[:, layer, 0] for layer in range(3)]
    moves = [RowMoves(layer, [3, 1], layer, [7, 0]) for layer in range(3)]
    gather_mixed_reference(GatherPlan.from_rows(sources, k_pool, moves), sources, k_pool)
    for layer in range(3):
        assert torch.equal(k_pool[layer][7], staging[3, layer, 0])
        assert torch.equal(k_pool[layer][0], staging[1, layer, 0])


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_sglang_host_pool_layouts_bind_as_views(layout: str) -> None:
    layers, pages, page, heads, dim = 3, 4, 4, 2, 8
    k_buffer = [torch.zeros(pages * page + page, heads, dim, dtype=torch.bfloat16) for _ in range(layers)]
    if layout == "page_first":  # [2, size, layer, head, dim]: token rows, strided by layer
        host = torch.randn(2, pages * page, layers, heads, dim).to(torch.bfloat16)
        sources = [host[0][:, layer] for layer in range(layers)]
        destinations = k_buffer
        src_rows, dst_rows = [5, 0, 9], [page + 1, page + 7, 3 * page]
    else:  # page_first_direct [2, page, layer, slot, head, dim]: whole pages as rows
        host = torch.randn(2, pages, layers, page, heads, dim).to(torch.bfloat16)
        sources = [host[0][:, layer] for layer in range(layers)]
        destinations = [k.view(-1, page, heads, dim) for k in k_buffer]
        src_rows, dst_rows = [2, 0], [1, 4]
    moves = [RowMoves(layer, src_rows, layer, dst_rows) for layer in range(layers)]
    gather_mixed_reference(GatherPlan.from_rows(sources, destinations, moves), sources, destinations)
    for layer in range(layers):
        for s, d in zip(src_rows, dst_rows):
            assert torch.equal(destinations[layer][d], sources[layer][s])


@pytest.mark.parametrize("moves", [[], [RowMoves(0, [], 1, [])]], ids=["no-moves", "empty-move"])
def test_empty_plan_is_a_no_op(moves: list[RowMoves]) -> None:
    case = make_reload_case(14, torch.bfloat16)
    plan = GatherPlan.from_rows(case.sources, case.destinations, moves)
    assert plan.num_segments == 0 and plan.total_bytes == 0
    gather_mixed(plan, case.sources, case.destinations, backend="torch")
    assert bit_exact(case.destinations, case.initial)


def _small() -> ReloadCase:
    src = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    dst = torch.zeros(4, 2)
    return ReloadCase([src], [dst], [RowMoves(0, [0, 5], 0, [1, 3])], [dst.clone()])


@pytest.mark.parametrize(
    "moves, error, message",
    [
        ([RowMoves(0, [0, 6], 0, [1, 2])], IndexError, r"moves\[0\].src_rows\[1\] = 6 is out of range \[0, 6\)"),
        ([RowMoves(0, [0, 1], 0, [1, 4])], IndexError, r"moves\[0\].dst_rows\[1\] = 4 is out of range \[0, 4\)"),
        ([RowMoves(0, [-1], 0, [1])], IndexError, r"moves\[0\].src_rows\[0\] = -1"),
        ([RowMoves(1, [0], 0, [1])], IndexError, r"moves\[0\].src = 1 is out of range \[0, 1\)"),
        ([RowMoves(0, [0], 2, [1])], IndexError, r"moves\[0\].dst = 2 is out of range"),
        ([RowMoves(0, [0, 1], 0, [1])], ValueError, r"2 src_rows vs 1 dst_rows"),
        ([RowMoves(0, [0.5], 0, [1])], TypeError, r"moves\[0\].src_rows: row indices must be integers"),
        ([RowMoves(0, [0], 0, [1]), RowMoves(0, [2], 0, [1])], ValueError, r"both write destinations\[0\]"),
    ],
)
def test_bad_row_moves_fail_before_any_copy(moves: list[RowMoves], error: type, message: str) -> None:
    case = _small()
    with pytest.raises(error, match=message):
        GatherPlan.from_rows(case.sources, case.destinations, moves)


def test_dtype_and_width_mismatches_are_refused() -> None:
    src = torch.zeros(3, 4, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"sources\[0\] is torch.bfloat16 but destinations\[0\] is torch.float16"):
        GatherPlan.from_rows([src], [torch.zeros(3, 4, dtype=torch.float16)], [RowMoves(0, [0], 0, [0])])
    with pytest.raises(ValueError, match=r"rows of sources\[0\] are 8 bytes, rows of destinations\[0\] are 10 bytes"):
        GatherPlan.from_rows([src], [torch.zeros(3, 5, dtype=torch.bfloat16)], [RowMoves(0, [0], 0, [0])])


def test_tensors_whose_rows_are_not_dense_are_refused() -> None:
    pool = torch.zeros(4, 8, 2)
    with pytest.raises(ValueError, match=r"sources\[0\]: rows must be dense"):
        GatherPlan.from_rows([pool[:, :, 0]], [torch.zeros(4, 8)], [RowMoves(0, [0], 0, [0])])
    with pytest.raises(ValueError, match=r"destinations\[0\]: a 0-dim tensor has no rows"):
        GatherPlan.from_rows([pool], [torch.zeros(())], [])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_launch_refuses_tensors_that_do_not_match_the_plan(backend: str) -> None:
    case = _small()
    plan = case.plan()
    with pytest.raises(ValueError, match=r"plan expects 1 destinations, got 2"):
        gather_mixed(plan, case.sources, [*case.destinations, torch.zeros(4, 2)], backend=backend)
    with pytest.raises(ValueError, match=r"destinations\[0\]: row layout .* differs from the plan's"):
        gather_mixed(plan, case.sources, [torch.zeros(4, 3)], backend=backend)
    # A byte-segment plan that reaches past the end of the tensor it is bound to: caught before launch.
    past_end = GatherPlan.from_segments([0], [0], [0], [24], [16], num_sources=1, num_destinations=1)
    with pytest.raises(IndexError, match=r"destinations\[0\]: plan reaches byte 40 but the tensor spans 32"):
        gather_mixed(past_end, case.sources, case.destinations, backend=backend)
    assert bit_exact(case.destinations, case.initial)


def test_byte_segment_plans_validate_their_columns() -> None:
    with pytest.raises(IndexError, match=r"nbytes\[0\] = 0 is out of range"):
        GatherPlan.from_segments([0], [0], [0], [0], [0], num_sources=1, num_destinations=1)
    with pytest.raises(IndexError, match=r"src_id\[1\] = 3 is out of range \[0, 2\)"):
        GatherPlan.from_segments([0, 3], [0, 0], [0, 0], [0, 8], [8, 8], num_sources=2, num_destinations=1)
    with pytest.raises(ValueError, match=r"segment columns .* differ in length"):
        GatherPlan.from_segments([0], [0, 8], [0], [0], [8], num_sources=1, num_destinations=1)
    with pytest.raises(ValueError, match=r"max_segment_bytes = 12 must be a positive multiple of 8"):
        GatherPlan.from_segments([0], [0], [0], [0], [8], num_sources=1, num_destinations=1, max_segment_bytes=12)


def test_unknown_backend_is_refused() -> None:
    case = _small()
    with pytest.raises(ValueError, match=r"backend = 'cuda'; expected 'auto', 'triton' or 'torch'"):
        gather_mixed(case.plan(), case.sources, case.destinations, backend="cuda")


@pytest.mark.skipif(triton_interpreted(), reason="this process runs triton interpreted: the kernel would run")
def test_triton_on_cpu_without_the_interpreter_says_how_to_enable_it() -> None:
    case = _small()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1 set before importing triton"):
        gather_mixed(case.plan(), case.sources, case.destinations, backend="triton")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gather_rows_torch_path_moves_the_same_rows_as_the_plan(dtype: torch.dtype) -> None:
    case = make_reload_case(seed=11, dtype=dtype)
    assert gather_rows(case.sources, case.destinations, case.moves, backend="torch") == "torch"
    assert bit_exact(case.destinations, case.expected())
