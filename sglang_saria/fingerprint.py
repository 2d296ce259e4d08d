"""A model fingerprint: a digest of everything that decides the bytes of a KV page.

The store's keys are page hashes of token ids; the same tokens give other KV under other
weights, another KV dtype or layout, another page size, another TP shard. A store only serves
pages to the model that wrote them, so its index keeps the writer's fingerprint and a server
with another one never reads it (``hicache/store_identity.py``).

What goes in:

- ``config.json`` (parsed, keys sorted): architecture, sizes, RoPE;
- the weights, without reading them all: every weight file's name and size; a safetensors
  file's header (every tensor's name, dtype, shape and offsets) and, per tensor, its first and
  middle ``SAMPLE_BYTES`` (a fine-tune or an in-place weight update changes the bytes of every
  tensor it touches, and a tensor's first bytes are among them); another weight file (``.bin``,
  ``.pt``, ``.gguf``) by ``OTHER_SAMPLES`` chunks spread evenly over it. Reads stay near
  ``2 x SAMPLE_BYTES`` per tensor (about 6 MB for 700 tensors), so a 16 GB model costs well under
  a second, not the minutes a full hash would (``tests/test_fingerprint.py`` times one);
- the KV format: the host pool's layout and dtype, the page size, the TP rank and size;
- the server arguments that change KV bytes (``KV_ARGS``: dtype, KV cache dtype, a hybrid's
  state dtype, quantization, revision, model overrides, load format, LoRA adapters).

Not in it: the model's path and served name (a copy of the same weights elsewhere is the same
model; the served name stays in the store keys), the tokenizer (keys are token ids), the
attention backend and device (they move KV bytes by rounding only, as a cold run's do).
A weight change confined to bytes no sample covers (past a tensor's first and middle
``SAMPLE_BYTES``) goes unseen: the README says to give such a model a new store.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

SAMPLE_BYTES = 4096  # per tensor, read at its start and at its middle
OTHER_SAMPLES = 64  # chunks of a non-safetensors weight file, evenly spread
OTHER_CHUNK = 64 << 10
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MAX_HEADER_BYTES = 100 << 20  # a safetensors header larger than this is not one
# Server arguments that change the KV bytes of a page (besides the weights and config).
KV_ARGS = ("dtype", "kv_cache_dtype", "mamba_ssm_dtype", "quantization", "revision", "json_model_override_args",
           "load_format", "lora_paths")
DIGEST_CHARS = 16  # shown in logs and as a metric label; 64 bits tell models apart


@dataclass(frozen=True)
class KVFormat:
    """How a rank lays its KV pages out: what the host pool and the parallelism decide."""

    layout: str  # the host pool's layout (page_first, layer_first, ...)
    dtype: str  # the host pool's dtype
    page_size: int  # tokens per page
    tp_rank: int
    tp_size: int
    extra: str = ""  # the rest of the rank's identity (PP/CP/DP rank), as its directory names it


@dataclass(frozen=True)
class Fingerprint:
    """The digest, and what it was made of (for the start log)."""

    digest: str
    model: str  # the model path, or the name when no path is known
    weights: str  # how the weights were identified: "sampled N files, M tensors" or why not

    def __str__(self) -> str:
        return self.digest


def fingerprint(model_path: Optional[str], kv: KVFormat, server_args: Mapping[str, Any]) -> Fingerprint:
    """The fingerprint of ``model_path`` (a local directory; another value, e.g. a hub id or None,
    is identified by its name alone) serving KV in format ``kv`` under ``server_args``."""
    h = hashlib.sha256()
    h.update(b"saria-model-fingerprint-1\0")
    model = str(model_path) if model_path is not None else ""
    if model and os.path.isdir(model):
        config = os.path.join(model, "config.json")
        if os.path.exists(config):
            with open(config, "rb") as f:
                h.update(_canonical(json.load(f)))
        weights = _weights_digest(model, h)
    else:
        h.update(_canonical({"model": model}))
        weights = "not a local directory: identified by its name and the arguments only"
    h.update(_canonical({"kv": kv.__dict__}))
    h.update(_canonical({"args": {k: _jsonable(server_args.get(k)) for k in KV_ARGS}}))
    return Fingerprint(h.hexdigest()[:DIGEST_CHARS], model, weights)


def _weights_digest(model: str, h: "hashlib._Hash") -> str:
    files = sorted(f for f in os.listdir(model) if f.endswith(WEIGHT_SUFFIXES) and os.path.isfile(os.path.join(model, f)))
    tensors = 0
    for name in files:
        path = os.path.join(model, name)
        size = os.path.getsize(path)
        h.update(_canonical({"file": name, "size": size}))
        with open(path, "rb") as f:
            if name.endswith(".safetensors"):
                tensors += _safetensors_samples(f, size, path, h)
            else:
                for offset in _spread(size, OTHER_SAMPLES, OTHER_CHUNK):
                    f.seek(offset)
                    h.update(f.read(OTHER_CHUNK))
    if not files:
        return "no weight files found: identified by config.json and the arguments only"
    return f"sampled {len(files)} weight files, {tensors} tensors"


def _safetensors_samples(f: Any, size: int, path: str, h: "hashlib._Hash") -> int:
    """Hash the header and each tensor's first and middle bytes; returns the tensors sampled."""
    raw = f.read(8)
    if len(raw) < 8:
        raise ValueError(f"model fingerprint: {path}: {size} bytes, too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", raw)
    if header_len > min(MAX_HEADER_BYTES, size - 8):
        raise ValueError(f"model fingerprint: {path}: header of {header_len} bytes in a file of {size}: "
                         "not a safetensors file")
    header_bytes = f.read(header_len)
    h.update(header_bytes)
    header = json.loads(header_bytes)
    base = 8 + header_len
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    for start, end in spans:
        for offset in {start, start + (end - start) // 2}:
            f.seek(base + offset)
            h.update(f.read(min(SAMPLE_BYTES, end - offset)))
    return len(spans)


def _spread(size: int, count: int, chunk: int) -> Iterator[int]:
    """``count`` offsets of ``chunk``-byte reads spread evenly over ``size`` bytes (fewer if small)."""
    if size <= count * chunk:
        yield from range(0, size, chunk)
        return
    step = (size - chunk) / (count - 1)
    for i in range(count):
        yield int(i * step)


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=repr).encode() + b"\0"
