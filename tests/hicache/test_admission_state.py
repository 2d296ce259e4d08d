"""`auto`'s learned state file beside the store (hicache/admission_state.py): saved off the scheduler
thread at most every ``auto_state_save_s``, private, restored at start; a damaged file is ignored
(logged), never an error. On a real server: tests/e2e/test_auto_ghost_admission.py."""

import json
import os
import stat

from sglang_saria.hicache.admission_state import FILE_NAME, AdmissionStateFile, admission_state_file
from sglang_saria.mem_cache.admission import AdmissionEvent
from sglang_saria.mem_cache.auto import LoadAwareAdmission, LoadParams
from sglang_saria.mem_cache.learned import LearnedAdmission
from sglang_saria.mem_cache.metadata import ContextNode


def taught() -> LearnedAdmission:
    p = LearnedAdmission()
    p.on_clock(100.0)
    for k in range(20):
        p.admits_key(k, AdmissionEvent.EVICT, ContextNode(50.0, False))
    p.on_missed(range(5))
    return p


def test_saved_private_at_most_every_interval_and_restored(tmp_path):
    clock = [0.0]
    p = taught()
    f = AdmissionStateFile(p, str(tmp_path / FILE_NAME), lambda: clock[0], every_s=10.0)
    f.save()
    f._writer.join()
    assert f.saves == 1 and stat.S_IMODE(os.stat(tmp_path / FILE_NAME).st_mode) == 0o600
    p.on_missed(range(5, 10))
    clock[0] = 5.0
    f.save()  # within the interval: nothing written
    assert f.saves == 1 and sum(json.loads((tmp_path / FILE_NAME).read_text())["reused"]) == 5
    clock[0] = 10.0
    f.save()
    f._writer.join()
    assert f.saves == 2
    q = LearnedAdmission()
    assert admission_state_file(q, str(tmp_path), lambda: 0.0, 10.0) is not None
    assert q.seen == p.seen and q.reused == p.reused and q.ghost == p.ghost
    assert not (tmp_path / f"{FILE_NAME}.tmp").exists()


def test_a_damaged_file_is_ignored_and_a_policy_without_state_has_none(tmp_path):
    (tmp_path / FILE_NAME).write_text('{"version": 1, "seen": [1, 2]')  # cut short
    q = LearnedAdmission()
    assert not AdmissionStateFile(q, str(tmp_path / FILE_NAME)).load() and q.ghost == {} and sum(q.seen) == 0
    (tmp_path / FILE_NAME).write_text(json.dumps({"version": 1, "seen": [1], "reused": [0], "ghost": []}))
    assert not AdmissionStateFile(q, str(tmp_path / FILE_NAME)).load() and sum(q.seen) == 0
    assert admission_state_file(LoadAwareAdmission(LoadParams()), str(tmp_path), lambda: 0.0, 10.0) is None
