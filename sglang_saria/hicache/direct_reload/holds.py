"""A published reload's pages stay on the device until its request's prefill; what SGLang's
queue says about the requests waiting for reloads (`mem_cache/reload_admission.py` decides).

`ReloadHolds`: a published tail is locked from its publish until the request's prefill has
run (SGLang calls the radix cache's ``checkpoint(req)`` after every prefill, finished or not),
the request is aborted, or the hold's deadline passes (`transfer.reload_hold_s`; then the tail
is evictable like any cached prefix). Released earlier, the next reload's claim or another
request's admission evicts it before its request is admitted (the reload wasted); held without
the admission rule, reloads can lock the pool against their own requests (a deadlock).

`PrefillWatch`: the prefill rate a held-back reload's read is compared with
(`reload_admission.waiting_pays`), from the scheduler's cumulative prefill counters (the ones
its load reports keep: uncached tokens and busy microseconds of prefill batches).

`waiting_requests` / `decode_reserve` read SGLang's scheduler through its load inquirer
(handed to the radix cache at scheduler start, `LoadSignalMixin.read_scheduler_load`): the
waiting queue's order and each request's prompt and ``max_new_tokens`` (SGLang's admission
ask), and the new tokens the running requests may still decode (SGLang's reserve). O(queue +
running batch), run once per scheduler step and only while reloads wait for device memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

from sglang_saria.mem_cache.reload_admission import ReloadDemand, Throughput, admission_need
from sglang_saria.reload.pending import PendingReload


@dataclass
class Hold:
    """A published tail: its last node and lock, and where the reloaded prefix ends."""

    node: Any
    lock: Any  # None once the deadline has passed (the tail is evictable)
    end: int  # tokens of the request's prompt on the device once published
    deadline: float  # step clock


class ReloadHolds:
    """Published tails by request id, until the request's prefill, abort or the deadline."""

    def __init__(self) -> None:
        self.by_rid: dict[str, Hold] = {}

    def add(self, rid: str, hold: Hold) -> Optional[Hold]:
        """Hold ``rid``'s tail; returns the hold it replaces (a request reloaded again), to unlock."""
        previous = self.by_rid.get(rid)
        self.by_rid[rid] = hold
        return previous

    def take(self, rid: str) -> Optional[Hold]:
        return self.by_rid.pop(rid, None)

    def locked(self) -> set[str]:
        """Requests whose tail is still locked."""
        return {rid for rid, hold in self.by_rid.items() if hold.lock is not None}

    def expired(self, now: float) -> list[tuple[str, Hold]]:
        """Locked holds whose deadline has passed. The caller unlocks them (``lock = None``);
        they stay until their request's prefill, which still reports what it lost."""
        return [(rid, hold) for rid, hold in self.by_rid.items() if hold.lock is not None and now > hold.deadline]

    def clear(self) -> None:
        self.by_rid.clear()


@dataclass
class PrefillWatch:
    """The prefill rate, one observation per look: the tokens and busy time of the prefill
    batches since the previous look (SGLang's ``total_prefill_uncached_tokens`` and
    ``total_prefill_busy_us``), token-weighted (`Throughput`)."""

    rate: Throughput = field(default_factory=Throughput)
    last: Optional[tuple[int, int]] = None

    def tps(self, inquirer: Any) -> Optional[float]:
        now = (inquirer.get_total_prefill_uncached_tokens(), inquirer.get_total_prefill_busy_us())
        if self.last is not None:
            self.rate.add(now[0] - self.last[0], (now[1] - self.last[1]) / 1e6)
        self.last = now
        return self.rate.tps()


@dataclass(frozen=True)
class QueuedRequest:
    """A waiting request as SGLang's admission sees it."""

    position: int  # in the waiting queue
    prompt_tokens: int
    max_new_tokens: int  # still to decode, clipped as `add_one_req` clips it


def _new_tokens(req: Any) -> int:
    max_new = req.sampling_params.max_new_tokens or 0
    return min(max(max_new - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)


def waiting_requests(inquirer: Any) -> dict[str, QueuedRequest]:
    """The scheduler's waiting queue by request id, in its order."""
    return {
        req.rid: QueuedRequest(i, len(req.full_untruncated_fill_ids), _new_tokens(req))
        for i, req in enumerate(inquirer.get_waiting_queue())
    }


def decode_reserve(inquirer: Any) -> int:
    """Tokens the running requests may still decode (SGLang reserves them from admission; with
    its early-EOS ratio it reserves at most this)."""
    return sum(_new_tokens(req) for req in inquirer.get_running_batch().reqs)


def reload_demands(pendings: list[PendingReload], tokens: list[int], inquirer: Any, page_size: int,
                   waits_for_reload: Callable[[str], bool]) -> list[ReloadDemand]:
    """Each reload's demand (``tokens`` slots now, SGLang's admission ask then), its request's
    place in the waiting queue, and the summed admission ask of the requests ahead of it for
    which ``waits_for_reload`` is False (SGLang's loop reaches them first), each as its whole
    prompt: an unlocked device prefix is evictable room, which a claim may take. Without the
    scheduler's inquirer: the prompt the probe saw, no new tokens, arrival order."""
    queue = waiting_requests(inquirer) if inquirer is not None else {}
    plain = sorted((q.position, admission_need(q.prompt_tokens, 0, q.max_new_tokens, page_size))
                   for rid, q in queue.items() if not waits_for_reload(rid))
    demands = []
    for i, (pending, n) in enumerate(zip(pendings, tokens)):
        end = pending.start + n
        queued = queue.get(pending.rid)
        if queued is None:
            need, position = admission_need(pending.prompt_tokens, end, 0, page_size), len(queue) + i
        else:
            need, position = admission_need(queued.prompt_tokens, end, queued.max_new_tokens, page_size), queued.position
        ahead = sum(need_ahead for at, need_ahead in plain if at < position)
        demands.append(ReloadDemand(pending.rid, n, need, position, ahead))
    return demands
