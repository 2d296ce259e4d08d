"""The model fingerprint (sglang_saria/fingerprint.py): what changes the KV bytes changes it,
what does not (the model's path) leaves it; a 16 GB model costs well under 2 s."""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import pytest

from sglang_saria.fingerprint import SAMPLE_BYTES, KVFormat, fingerprint

KV = KVFormat(layout="page_first", dtype="bfloat16", page_size=16, tp_rank=0, tp_size=1, extra="rank_tp0of1")
ARGS = {"dtype": "auto", "kv_cache_dtype": "auto"}


@pytest.fixture
def model(tiny_model, tmp_path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(tiny_model, copy)
    return copy


def tensor_span(path: Path) -> tuple[int, int]:
    """The file offsets of the safetensors file's largest tensor."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    start, end = max((v["data_offsets"] for k, v in header.items() if k != "__metadata__"), key=lambda o: o[1] - o[0])
    return 8 + n + start, 8 + n + end


def rewrite(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x55]))


def test_the_same_weights_elsewhere_have_the_same_fingerprint(model, tiny_model):
    assert fingerprint(str(model), KV, ARGS).digest == fingerprint(str(tiny_model), KV, ARGS).digest


@pytest.mark.parametrize("where", ["first", "middle"])
def test_weights_updated_in_place_change_it(model, where):
    before = fingerprint(str(model), KV, ARGS).digest
    weights = model / "model.safetensors"
    start, end = tensor_span(weights)
    rewrite(weights, start if where == "first" else start + (end - start) // 2)
    assert fingerprint(str(model), KV, ARGS).digest != before


def test_config_kv_format_rank_and_kv_args_each_change_it(model):
    base = fingerprint(str(model), KV, ARGS).digest
    variants = [
        fingerprint(str(model), KVFormat(**{**KV.__dict__, "page_size": 32}), ARGS),
        fingerprint(str(model), KVFormat(**{**KV.__dict__, "dtype": "float16"}), ARGS),
        fingerprint(str(model), KVFormat(**{**KV.__dict__, "layout": "layer_first"}), ARGS),
        fingerprint(str(model), KVFormat(**{**KV.__dict__, "tp_rank": 1, "tp_size": 2}), ARGS),
        fingerprint(str(model), KV, {**ARGS, "kv_cache_dtype": "fp8_e4m3"}),
        fingerprint(str(model), KV, {**ARGS, "json_model_override_args": '{"rope_theta": 1}'}),
    ]
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rope_theta": config.get("rope_theta", 1e6) * 2}))
    variants.append(fingerprint(str(model), KV, ARGS))
    digests = [v.digest for v in variants]
    assert base not in digests and len(set(digests)) == len(digests)


def test_a_name_that_is_no_directory_is_identified_by_name_and_says_so():
    a, b = fingerprint("org/model-a", KV, ARGS), fingerprint("org/model-b", KV, ARGS)
    assert a.digest != b.digest and "not a local directory" in a.weights


def test_a_damaged_safetensors_file_is_named(model):
    (model / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="model.safetensors: header of"):
        fingerprint(str(model), KV, ARGS)


def test_a_16_gb_model_of_700_tensors_costs_under_2_s(tmp_path):
    """Sparse files of real size and header (the holes read as zeros): what is bounded is the bytes
    read, about 2 x SAMPLE_BYTES per tensor; on a cold NVMe that is ~1,400 reads of 4 KiB."""
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text('{"architectures": ["Big"]}')
    per_file, files = 175, 4
    size = 4 << 30
    tensor = size // per_file
    for j in range(files):
        header = {f"layer.{j * per_file + i}.weight": {"dtype": "BF16", "shape": [tensor // 2],
                                                         "data_offsets": [i * tensor, (i + 1) * tensor]}
                  for i in range(per_file)}
        raw = json.dumps(header).encode()
        with open(big / f"model-{j:05d}.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + per_file * tensor)
    t0 = time.perf_counter()
    fp = fingerprint(str(big), KV, ARGS)
    elapsed = time.perf_counter() - t0
    assert fp.weights == f"sampled {files} weight files, {files * per_file} tensors"
    assert sum(p.stat().st_size for p in big.iterdir()) > 16e9
    assert elapsed < 2.0, elapsed
    assert 2 * SAMPLE_BYTES * files * per_file < 8 << 20  # what it read: under 8 MiB of 16 GB
