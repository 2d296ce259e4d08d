"""What a reload asks of the device pool, read from SGLang's waiting queue
(`hicache/direct_reload/holds.py::reload_demands`): its own need at admission, its place in the
queue, and the needs of the requests ahead of it that wait for no reload (SGLang's admission
loop reaches them first; `mem_cache/reload_admission.py`). The queue here holds objects with the
fields of SGLang's `Req` that the function reads."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_saria.hicache.direct_reload.holds import reload_demands

PAGE = 16


def req(rid: str, prompt: int, max_new: int = 8) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, full_untruncated_fill_ids=[0] * prompt, output_ids=[],
                           sampling_params=SimpleNamespace(max_new_tokens=max_new))


class Scheduler:
    def __init__(self, waiting: list[SimpleNamespace]) -> None:
        self.waiting = waiting

    def get_waiting_queue(self) -> list[SimpleNamespace]:
        return self.waiting


def pending(rid: str, start: int, prompt: int) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, start=start, prompt_tokens=prompt)


def test_requests_ahead_that_wait_for_no_reload_are_counted_with_their_whole_prompt():
    queue = [req("plain", 500), req("reloading", 400), req("held", 300), req("me", 600), req("after", 900)]
    waits = {"reloading", "held", "me"}.__contains__
    (me,) = reload_demands([pending("me", 0, 600)], [480], Scheduler(queue), PAGE, waits)
    assert me.position == 3
    assert me.need == (600 - 480) + 8 + PAGE
    # "plain" only ("after" is behind it), whole: its device prefix is evictable, a claim may take it
    assert me.ahead == 500 + 8 + PAGE


def test_without_the_scheduler_no_request_is_ahead():
    (me,) = reload_demands([pending("me", 32, 600)], [480], None, PAGE, lambda rid: False)
    assert (me.position, me.need, me.ahead) == (0, 600 - 512 + PAGE, 0)
