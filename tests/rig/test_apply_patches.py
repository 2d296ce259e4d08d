"""saria_cpu_rig.apply_patches: all-or-none, idempotent, --check names the failing hunk, wrong versions refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from saria_cpu_rig import apply_patches

ORIGINAL = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"


def patch_text(name: str, old: str, new: str) -> str:
    return (
        f"# What: {name}\n--- a/sglang/mod.py\n+++ b/sglang/mod.py\n"
        f"@@ -1,3 +1,3 @@\n def f():\n-    return {old}\n+    return {new}\n \n"
    )


@pytest.fixture
def site(tmp_path):
    (tmp_path / "site-packages" / "sglang").mkdir(parents=True)
    (tmp_path / "site-packages" / "sglang" / "mod.py").write_text(ORIGINAL)
    (tmp_path / "patches").mkdir()
    return tmp_path / "site-packages", tmp_path / "patches"


def write_patch(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_apply_is_idempotent_and_revert_restores_the_original(site):
    packages, folder = site
    patches = [write_patch(folder, "001-one.patch", patch_text("one", 1, 10))]
    assert [o.status for o in apply_patches.run(patches, packages, "apply")] == ["applied"]
    assert "return 10" in (packages / "sglang" / "mod.py").read_text()
    assert [o.status for o in apply_patches.run(patches, packages, "apply")] == ["already applied"]
    assert [o.status for o in apply_patches.run(patches, packages, "revert")] == ["reverted"]
    assert (packages / "sglang" / "mod.py").read_text() == ORIGINAL


def test_a_patch_that_does_not_apply_is_named_and_nothing_changes(site):
    packages, folder = site
    patches = [
        write_patch(folder, "001-good.patch", patch_text("good", 1, 10)),
        write_patch(folder, "002-stale.patch", patch_text("stale", 7, 8)),
    ]
    with pytest.raises(apply_patches.PatchError, match=r"002-stale.patch does not apply: .*sglang/mod.py:1"):
        apply_patches.run(patches, packages, "apply")
    assert (packages / "sglang" / "mod.py").read_text() == ORIGINAL, "all or none: the good patch is not applied either"
    with pytest.raises(apply_patches.PatchError, match="002-stale.patch"):
        apply_patches.run(patches, packages, "check")


def test_a_later_patch_may_build_on_an_earlier_one_in_the_same_file(site):
    packages, folder = site
    patches = [
        write_patch(folder, "001-one.patch", patch_text("one", 1, 10)),
        write_patch(folder, "002-two.patch", patch_text("two", 10, 100)),
    ]
    assert [o.status for o in apply_patches.run(patches, packages, "check")] == ["applied", "applied"]
    assert (packages / "sglang" / "mod.py").read_text() == ORIGINAL, "--check changes nothing"
    apply_patches.run(patches, packages, "apply")
    assert "return 100" in (packages / "sglang" / "mod.py").read_text()


def test_wrong_sglang_version_is_refused_naming_both(monkeypatch, capsys, site):
    packages, folder = site
    write_patch(folder, "001-one.patch", patch_text("one", 1, 10))
    monkeypatch.setattr(apply_patches, "installed_sglang", lambda: ("0.5.22", packages))
    assert apply_patches.main(["--patch-dir", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "0.5.22" in err and "0.5.23" in err and "not modified" in err
    assert (packages / "sglang" / "mod.py").read_text() == ORIGINAL


def test_project_patches_are_in_place_in_this_environment():
    version, packages = apply_patches.installed_sglang()
    assert version == apply_patches.PINNED_VERSION
    patches = sorted(apply_patches.PATCH_DIR.glob("*.patch"))
    assert patches, "no patches found"
    outcomes = apply_patches.run(patches, packages, "check")
    assert {o.status for o in outcomes} == {"already applied"}
