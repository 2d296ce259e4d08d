"""The device digest (digest.py, kernels/checksum.py): its definition, the Triton kernel (interpreted in
a subprocess on CPU, compiled on a GPU) against numpy, and the value the store records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_saria.digest import Lanes, as_int64, digest, lanes
from sglang_saria.kernels.checksum import row_digests, verify_rows

HERE = Path(__file__).resolve().parent


def random_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("cuts", [(4096,), (4, 8, 4000), (12, 65536)])
def test_lanes_of_word_aligned_ranges_add_up_to_the_digest(cuts):
    data = random_bytes(70_001)
    bounds = [0, *cuts, data.size]
    parts = [lanes([data[lo:hi]], lo) for lo, hi in zip(bounds, bounds[1:])]
    assert sum(parts, Lanes()).digest == digest(data)


def test_objects_beyond_the_cached_index_terms_agree_with_the_cached_part():
    data = random_bytes(9 << 20, seed=6)  # past the 8 MiB of cached terms
    head, tail = lanes([data[: 4 << 20]], 0), lanes([data[4 << 20 :]], 4 << 20)
    assert (head + tail).digest == digest(data)


def test_pieces_that_split_a_word_give_the_same_lanes():
    data = random_bytes(1003, seed=1)
    assert lanes([data[:5], data[5:998], data[998:]], 0) == lanes([data], 0)


def test_any_single_bit_flip_changes_the_digest():
    data = random_bytes(4096, seed=2)
    base = digest(data)
    for pos in range(0, data.size, 97):
        for bit in (0, 7):
            flipped = data.copy()
            flipped[pos] ^= 1 << bit
            assert digest(flipped) != base, (pos, bit)


def test_swapped_words_change_the_digest():
    data = random_bytes(4096, seed=3)
    swapped = data.copy()
    swapped[0:4], swapped[8:12] = data[8:12].copy(), data[0:4].copy()
    assert digest(swapped) != digest(data)


def test_a_digest_holds_for_its_size_only():
    # Zero padding to a word makes 5 and 8 zero bytes alike: the store checks sizes first.
    assert digest(np.zeros(5, np.uint8)) == digest(np.zeros(8, np.uint8))


def test_lanes_refuse_an_offset_inside_a_word():
    with pytest.raises(ValueError, match="byte_offset 6 is not a multiple of 4"):
        lanes([random_bytes(8)], 6)


def test_numpy_rows_and_int64_bits():
    rows = torch.from_numpy(random_bytes(3 * 1000, seed=4).reshape(3, 1000))
    got = row_digests(rows, backend="numpy").tolist()
    assert got == [as_int64(digest(r)) for r in rows.numpy()]
    assert verify_rows(rows, [digest(r) for r in rows.numpy()], backend="numpy").all()
    assert as_int64((1 << 64) - 1) == -1 and as_int64(5) == 5


@pytest.fixture(scope="module")
def interpreter_results(run_interpreted) -> dict[str, dict]:
    return run_interpreted(HERE / "checksum_interpreter.py")


def test_subprocess_runs_the_interpreted_kernel(interpreter_results):
    assert interpreter_results["interpreted"]["value"] is True


@pytest.mark.parametrize("label", ["bf16", "fp16", "fp32", "u8"])
def test_interpreted_kernel_equals_numpy_bit_for_bit(interpreter_results, label):
    r = interpreter_results[f"rows-{label}"]
    assert r["kernel_matches_numpy"], r
    assert r["verified"] == [True, True, True]
    assert r["flip_detected"] == [True, False, True]


def test_interpreted_kernel_equals_the_digest_the_store_recorded(interpreter_results):
    r = interpreter_results["store"]
    assert r["kernel_matches_store"] and r["numpy_matches_store"], r
    assert r["verified"] == [True] * 4


def test_interpreted_kernel_on_no_rows(interpreter_results):
    assert interpreter_results["empty"]["digests"] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPU: compiled digest kernel")
def test_compiled_kernel_equals_numpy_on_gpu():
    data = random_bytes(8 * 70_000, seed=5).reshape(8, 70_000)
    rows = torch.from_numpy(data).cuda()
    assert row_digests(rows).cpu().tolist() == [as_int64(digest(r)) for r in data]
