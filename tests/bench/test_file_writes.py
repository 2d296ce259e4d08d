"""`bench/file_writes.FileWriteCounter` on a real folder: it counts the pages written the way
SGLang's HiCacheFile writes them (a temporary file renamed to ``<key>.bin``), also when a
bounded store deletes pages, which the bytes left on disk do not show."""

import os
import time

from sglang_saria.bench.file_writes import FileWriteCounter


def _write_page(folder, key: str, size: int) -> None:
    tmp = folder / f".{key}.tmp"
    tmp.write_bytes(b"x" * size)
    os.replace(tmp, folder / f"{key}.bin")


def test_every_renamed_page_counts_once_with_its_size(tmp_path):
    counter = FileWriteCounter(tmp_path)
    _write_page(tmp_path, "a_model_0_1", 4096)
    _write_page(tmp_path, "b_model_0_1", 4096)
    _write_page(tmp_path, "b.mamba_model_0_1", 1000)
    (tmp_path / "b_model_0_1.bin").unlink()  # evicted (LRU) ...
    _write_page(tmp_path, "b_model_0_1", 4096)  # ... and written again: a second write
    (tmp_path / "notes.txt").write_text("not a page")
    time.sleep(0.3)
    assert counter.close() == 3 * 4096 + 1000
    assert counter.pages_written == 4
    assert sum(f.stat().st_size for f in tmp_path.glob("*.bin")) == 2 * 4096 + 1000  # what is left undercounts


def test_a_page_deleted_before_it_was_measured_counts_as_the_last_size_of_its_kind(tmp_path):
    counter = FileWriteCounter(tmp_path)
    _write_page(tmp_path, "a_model_0_1", 4096)
    time.sleep(0.3)  # measured
    _write_page(tmp_path, "c_model_0_1", 4096)
    (tmp_path / "c_model_0_1.bin").unlink()
    assert counter.close() == 2 * 4096
