"""sglang-saria is a plugin: it reaches SGLang through its entry point and hooks, never by
editing the `sglang` package. The only SGLang files that differ from the wheel's RECORD are the
CPU test rig's patches (rig/README.md), which a GPU install does not apply."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata

from saria_cpu_rig import apply_patches


def _edited_sglang_files() -> set[str]:
    dist = importlib.metadata.distribution("sglang")
    edited = set()
    for entry in dist.files or []:
        if entry.hash is None or entry.hash.mode != "sha256" or not str(entry).startswith("sglang/"):
            continue
        path = entry.locate()
        if not path.exists():
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
        if digest != entry.hash.value:
            edited.add(str(entry))
    return edited


def test_only_the_cpu_rigs_patches_edit_sglang():
    rig_files = {name for patch in sorted(apply_patches.PATCH_DIR.glob("*.patch"))
                 for name in apply_patches.touched_files(patch)}
    edited = _edited_sglang_files()
    assert edited, "the CPU rig's patches are applied on this machine (scripts/setup.sh, CPU mode)"
    assert edited <= rig_files, f"SGLang files edited outside the CPU rig: {sorted(edited - rig_files)}"


def test_the_plugin_is_an_sglang_entry_point_and_registers_saria():
    points = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert [p.value for p in points if p.name == "saria"] == ["sglang_saria.plugin:register"]
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang.srt.plugins import load_plugins

    load_plugins()
    assert StorageBackendFactory._registry["saria"]["module_path"] == "sglang_saria.hicache.backend"
    from sglang.srt.entrypoints.openai import protocol

    assert "saria" in protocol.ChatCompletionRequest.model_fields
