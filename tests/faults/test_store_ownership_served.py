"""A store never serves KV it does not own, on real servers (the tiny model):

- weights updated in place (same path, same config, same tensor shapes, other values) and the
  server restarted on the same store: the store of the old weights is set aside (the log names
  both fingerprints), the prompt gets 0 storage-hit tokens and the new model's cold output;
- a second server started on a store another server holds exits non-zero naming the PID that
  holds it, and the first keeps its store: after both stop, a third serves every prefix the first
  wrote.

A lock a killed server left never blocks: tests/faults/test_kill_mid_write.py restarts on one.
The store-level versions: tests/hicache/test_store_identity.py, tests/storage/test_storage_lock.py.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_saria.launcher import (AUDIT_ENV, SGLangServer, ServerConfig, ServerError, assert_kv_audit_clean,
                                   assert_matches_cold, cached_tokens, logprob_diff, saria_hicache_args, saria_metrics)
from tests.conftest import SMALL_POOLS
from tests.faults.serving import COMPUTED, FROM_STORAGE, PROMPT, other_prompt, sample, store_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FINGERPRINT = re.compile(r"model fingerprint ([0-9a-f]{16})")


def server(model: Path, args: list[str], log: Path) -> SGLangServer:
    return SGLangServer(ServerConfig(model, args=SMALL_POOLS + args, log_path=log, env=dict(AUDIT_ENV)))


def update_weights_in_place(model: Path) -> None:
    """Other values in every attention projection of layer 0, same names, shapes and dtypes: the
    file keeps its size and header, as a fine-tuned checkpoint copied over the old one does."""
    path = model / "model.safetensors"
    tensors = load_file(path)
    header_before = path.read_bytes()[:8]
    for name in tensors:
        if ".layers.0.self_attn." in name and name.endswith("proj.weight"):
            tensors[name] = (tensors[name].float() * -1.5).to(tensors[name].dtype)
    save_file(tensors, path, metadata={"format": "pt"})
    assert path.read_bytes()[:8] == header_before


@dataclass
class Swap:
    a: dict = field(default_factory=dict)  # model A's run (computed, stored)
    b: dict = field(default_factory=dict)  # model B on A's store
    b_cold: dict = field(default_factory=dict)  # model B without any cache
    b_again: dict = field(default_factory=dict)  # model B's second request (its own store)
    fingerprints: list[str] = field(default_factory=list)
    b_log: str = ""
    b_metrics: str = ""
    set_aside: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def swap(tiny_model, tmp_path_factory) -> Swap:
    root = tmp_path_factory.mktemp("swap")
    model, store = root / "model", root / "store"
    shutil.copytree(tiny_model, model)
    s = Swap()
    args = saria_hicache_args(store_config(store))
    with server(model, args, root / "a.log") as a:
        s.a = a.generate(PROMPT)
        a.wait_storage_writes()
    update_weights_in_place(model)
    with server(model, args, root / "b.log") as b:
        s.b = b.generate(PROMPT)
        b.wait_storage_writes()
        s.b_again = b.generate(PROMPT)
        s.b_metrics = b.metrics()
    s.b_log = (root / "b.log").read_text(errors="replace")
    s.fingerprints = [FINGERPRINT.search((root / f"{n}.log").read_text()).group(1) for n in ("a", "b")]
    s.set_aside = sorted(p.name for p in store.iterdir() if ".set-aside-" in p.name)
    with server(model, ["--disable-radix-cache"], root / "cold.log") as cold:
        s.b_cold = cold.generate(PROMPT)
    return s


def test_updated_weights_get_no_storage_hit_and_the_new_models_cold_output(swap):
    assert cached_tokens(swap.a) == COMPUTED
    assert cached_tokens(swap.b) == COMPUTED  # 0 storage-hit tokens: A's KV is never read
    assert_matches_cold(swap.b, swap.b_cold, "model B on model A's store")
    assert not logprob_diff(swap.a, swap.b_cold).within()  # the update changed what the model computes


def test_the_old_store_is_set_aside_naming_both_fingerprints(swap):
    a, b = swap.fingerprints
    assert a != b
    assert len(swap.set_aside) == 1 and swap.set_aside[0].startswith("rank_tp0of1.set-aside-")
    assert swap.set_aside[0].endswith(f"-{a}")
    warning = [line for line in swap.b_log.splitlines() if "moved aside" in line]
    assert len(warning) == 1 and a in warning[0] and b in warning[0]
    assert sample(swap.b_metrics, "sglang:saria_store_info", fingerprint=b) == 1
    assert sample(swap.b_metrics, "sglang:saria_store_info", fingerprint=a) == 0


def test_the_new_model_then_stores_and_serves_its_own_kv(swap):
    assert cached_tokens(swap.b_again)["device"] + cached_tokens(swap.b_again)["host"] > 0
    assert_kv_audit_clean(saria_metrics(swap.b_metrics), ("device_to_host", "host_to_ssd"))


@dataclass
class Shared:
    second_error: str = ""
    first_scheduler_pids: set[int] = field(default_factory=set)
    first_tiers: dict[str, dict[str, int]] = field(default_factory=dict)
    third_tiers: dict[str, dict[str, int]] = field(default_factory=dict)
    third_results: dict[str, dict] = field(default_factory=dict)
    third_metrics: dict[str, float] = field(default_factory=dict)


def group_pids(pgid: int) -> set[int]:
    """The live PIDs of a process group (a server's main process and its scheduler; an exited
    one not yet reaped, a zombie, is not counted)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp
                pids.add(int(entry))
    return pids


@pytest.fixture(scope="module")
def shared(tiny_model, tmp_path_factory) -> Shared:
    root = tmp_path_factory.mktemp("shared")
    store = root / "store"
    args = saria_hicache_args(store_config(store))
    prompts = {"prompt": PROMPT, "other": other_prompt(0)}
    s = Shared()
    with server(tiny_model, args, root / "first.log") as first:
        for what, prompt in prompts.items():
            s.first_tiers[what] = cached_tokens(first.generate(prompt))
        first.wait_storage_writes()
        s.first_scheduler_pids = group_pids(first.process.pid)
        second = server(tiny_model, args, root / "second.log")
        try:
            second.start()
        except ServerError as e:
            s.second_error = str(e) + "\n" + (root / "second.log").read_text(errors="replace")
        else:
            second.stop()
        first.generate(other_prompt(1))  # the first still serves
    with server(tiny_model, args, root / "third.log") as third:
        for what, prompt in prompts.items():
            s.third_results[what] = third.generate(prompt)
            s.third_tiers[what] = cached_tokens(s.third_results[what])
        s.third_metrics = saria_metrics(third.metrics())
    return s


def test_a_second_server_on_a_held_store_exits_non_zero_naming_the_holder(shared):
    code = re.search(r"exited with code (-?\d+)", shared.second_error)
    assert code and int(code.group(1)) != 0, shared.second_error[-2000:]
    holder = re.search(r"process (\d+) holds its lock", shared.second_error)
    assert holder and int(holder.group(1)) in shared.first_scheduler_pids, shared.second_error[-2000:]


def test_after_both_stop_a_third_serves_every_prefix_the_first_wrote(shared, cold_run):
    assert shared.first_tiers == {"prompt": COMPUTED, "other": COMPUTED}
    assert shared.third_tiers == {"prompt": FROM_STORAGE, "other": FROM_STORAGE}
    for what, prompt in {"prompt": PROMPT, "other": other_prompt(0)}.items():
        assert_matches_cold(shared.third_results[what], cold_run(prompt), what)
    assert_kv_audit_clean(shared.third_metrics, ("ssd_to_device",))
