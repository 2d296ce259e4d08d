"""KV-transport audit (`SGLANG_SARIA_AUDIT_KV=1`): the bytes Saria moves between tiers are
the bytes that were computed.

Comparing a cached run's logprobs with a cold run's cannot be exact on every machine (a
cached prefix runs prefill with other shapes, and CPU kernels pick shape-dependent paths),
so the byte-level guarantee is checked where it is made: every page that moves.

A page's digest is xxh3 over its rows in one canonical order (per pool tensor: K and V of
each layer for full attention; temporal, conv and side states for mamba), so a device
page, its host copy and its stored copy of the same bytes have the same digest whatever
the host layout. The audit takes a page's digest when it leaves the device (every
device -> host copy: write-through, promotion), checks the host copy against it, and
re-digests the destination after every load into the device pool (from host memory or
straight from the store), before every store write (the host copy still holds what left
the device) and after every store read into host memory. Expected digests follow each
copy: one per host page slot, one per stored page (appended to a log next to the store,
so a restarted server audits what an earlier one wrote).

Checks and mismatches are counted per path and pool (`sglang:saria_kv_audit_pages_total{path,pool}`,
`sglang:saria_kv_audit_errors_total{path,pool}`). Pages whose expected digest is unknown (a
store written without the audit) are not counted as checked.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import xxhash

from sglang_saria.storage.private import open_private

logger = logging.getLogger(__name__)

AUDIT_ENV = "SGLANG_SARIA_AUDIT_KV"
LOG_NAME = "kv_audit.log"

DEVICE_TO_HOST = "device_to_host"  # write-through, promotion
HOST_TO_DEVICE = "host_to_device"  # HiCache load-back, the DRAM part of a direct reload
HOST_TO_SSD = "host_to_ssd"  # store write of a host page
SSD_TO_HOST = "ssd_to_host"  # HiCache prefetch into the host pool
SSD_TO_DEVICE = "ssd_to_device"  # direct reload


def audit_enabled() -> bool:
    return os.environ.get(AUDIT_ENV, "0") == "1"


RowsFn = Callable[[torch.Tensor], list[torch.Tensor]]


@dataclass(frozen=True)
class PoolRows:
    """One pool's pages as rows by slot, on the device and in the host pool, in one order."""

    name: str
    page_size: int  # slots per page: tokens for KV, 1 for mamba states
    host: RowsFn
    device: RowsFn

    @classmethod
    def of_host_pool(cls, name: str, host_pool: Any) -> Optional["PoolRows"]:
        """Rows of an MHA KV host pool or a mamba state host pool (None: another kind)."""
        if hasattr(host_pool, "device_k_buffers"):
            return _mha_rows(name, host_pool)
        if hasattr(host_pool, "temporal_buffer") and not getattr(host_pool, "mtp_draft_buffer_infos", ()):
            return _mamba_rows(name, host_pool)
        return None


def _mha_rows(name: str, pool: Any) -> Optional[PoolRows]:
    k, v, buf, page = list(pool.device_k_buffers), list(pool.device_v_buffers), pool.kv_buffer, pool.page_size
    layers = range(len(k))
    if pool.layout == "layer_first":  # [2, layer, slot, head, dim]
        host = lambda s: [buf[kv, l][s] for kv in (0, 1) for l in layers]  # noqa: E731
    elif pool.layout == "page_first":  # [2, slot, layer, head, dim]
        host = lambda s: [buf[kv][s, l] for kv in (0, 1) for l in layers]  # noqa: E731
    elif pool.layout == "page_first_direct":  # [2, page, layer, token in page, head, dim]
        host = lambda s: [buf[kv][s // page, l, s % page] for kv in (0, 1) for l in layers]  # noqa: E731
    else:
        logger.warning("saria KV audit: host layout %r of pool %s is not audited", pool.layout, name)
        return None
    return PoolRows(name, page, host, lambda s: [t[s.to(t.device)] for t in k + v])


def _mamba_rows(name: str, pool: Any) -> PoolRows:
    # Host: [slot, layer, 1, *state] (page-first layouts, the only ones mamba host pools take);
    # device: [layer, slot, *state]; side states: [slot, ...] on both.
    info = pool.buffer_info
    pairs = [(pool.temporal_buffer, info.temporal)] + list(zip(pool.conv_buffer, info.conv))
    sides = list(zip(pool.slot_state_buffers, pool.slot_state_device_tensors))

    def host(s: torch.Tensor) -> list[torch.Tensor]:
        return [h[s][:, :, 0].transpose(0, 1) for h, _ in pairs] + [h[s] for h, _ in sides]

    def device(s: torch.Tensor) -> list[torch.Tensor]:
        return [d[:, s.to(d.device)] for _, d in pairs] + [d[s.to(d.device)] for _, d in sides]

    return PoolRows(name, 1, host, device)


def _digest(tensors: Sequence[torch.Tensor]) -> int:
    h = xxhash.xxh3_64()
    for t in tensors:
        if t.numel():
            h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
    return h.intdigest()


class KVAudit:
    """Expected digests of every host and stored page copy, and the checks of each move."""

    def __init__(
        self,
        pools: dict[str, PoolRows],
        on_checked: Callable[[str, str, int, int], None],
        log_dir: Optional[str] = None,
    ) -> None:
        """``on_checked(path, pool, pages, errors)`` is told every batch of checks (metrics);
        ``log_dir``: where stored-page digests are appended and read back after a restart."""
        self.pools = pools
        self._on_checked = on_checked
        self._host: dict[tuple[str, int], int] = {}  # (pool, first host slot of the page) -> digest
        self._stored: dict[tuple[str, str], int] = {}  # (pool, page hash) -> digest
        self._log_path = Path(log_dir) / LOG_NAME if log_dir else None
        self.bad_log_lines = 0  # torn or garbled lines of the log, ignored (a crash mid-append)
        if self._log_path is not None and self._log_path.exists():
            self._read_log(self._log_path)

    def _read_log(self, path: Path) -> None:
        """Stored digests an earlier server appended. A line it did not finish (killed mid-append)
        or cannot be parsed is ignored and counted, and a torn last line is cut off, so the next
        append starts a line of its own: the audit checks less, never stops the server."""
        fd = open_private(str(path), os.O_RDWR)
        with os.fdopen(fd, "r+b") as log:
            data = log.read()
            complete = data.rfind(b"\n") + 1
            bad = [] if complete == len(data) else [len(data[:complete].splitlines()) + 1]
            for number, line in enumerate(data[:complete].splitlines(), 1):
                record = _parse_log_line(line)
                if record is None:
                    bad.append(number)
                else:
                    self._stored[record[0]] = record[1]
            if complete != len(data):
                log.truncate(complete)
        if bad:
            self.bad_log_lines = len(bad)
            logger.warning("saria KV audit: %s: %d torn or unreadable line(s) ignored (line %s); their pages are not audited",
                           path, len(bad), ", ".join(map(str, bad[:5])))

    def follow_log(self, log_dir: str) -> None:
        """A store attached at run time (`attach_audit`): its log's digests join the expected
        ones (page hashes name their content, so what another store held stays true) and new
        stored digests are appended there."""
        path = Path(log_dir) / LOG_NAME
        if path != self._log_path:
            self._log_path = path
            if path.exists():
                self._read_log(path)

    def _pages(self, pool: PoolRows, slots: torch.Tensor) -> list[torch.Tensor]:
        slots = slots.reshape(-1).to("cpu", torch.int64)
        return list(slots.split(pool.page_size)) if slots.numel() else []

    def digests(self, pool_name: str, slots: torch.Tensor, side: str) -> list[int]:
        """Digest of each page at ``slots`` (page_size slots a page) on ``side`` ("host"/"device")."""
        pool = self.pools[pool_name]
        rows = pool.host if side == "host" else pool.device
        return [_digest(rows(page)) for page in self._pages(pool, slots)]

    def _report(self, path: str, pool_name: str, what: Sequence[str], got: Sequence[int], want: Sequence[Optional[int]]) -> None:
        checked = [(w, g, e) for w, g, e in zip(what, got, want) if e is not None]
        errors = [w for w, g, e in checked if g != e]
        for w in errors:
            logger.error("saria KV audit: %s page %s of pool %s differs from the bytes that left the device", path, w, pool_name)
        if checked:
            self._on_checked(path, pool_name, len(checked), len(errors))

    def _host_keys(self, pool_name: str, host_slots: torch.Tensor) -> list[tuple[str, int]]:
        return [(pool_name, int(page[0])) for page in self._pages(self.pools[pool_name], host_slots)]

    # ------------------------------------------------------------------ device <-> host
    def device_to_host(self, pool_name: str, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """After a device -> host copy: the host pages equal the device pages, which become
        the expected content of those host slots."""
        left = self.digests(pool_name, device_slots, "device")
        keys = self._host_keys(pool_name, host_slots)
        self._report(DEVICE_TO_HOST, pool_name, [str(k[1]) for k in keys], self.digests(pool_name, host_slots, "host"), left)
        self._host.update(zip(keys, left))

    def host_to_device(self, pool_name: str, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """After a host -> device copy: the device pages hold what the host copies must hold."""
        keys = self._host_keys(pool_name, host_slots)
        want = [self._host.get(k) for k in keys]
        self._report(HOST_TO_DEVICE, pool_name, [str(k[1]) for k in keys], self.digests(pool_name, device_slots, "device"), want)

    # ------------------------------------------------------------------ host <-> store
    def host_to_store(self, pool_name: str, page_hashes: Sequence[str], host_slots: torch.Tensor, written: Sequence[bool]) -> None:
        """Before a store write of host pages (``written``: newly stored): the host copies
        still hold what left the device; their digests become the stored pages' expectation."""
        keys = self._host_keys(pool_name, host_slots)
        now = self.digests(pool_name, host_slots, "host")
        want = [self._host.get(k) for k in keys]
        self._report(HOST_TO_SSD, pool_name, list(page_hashes), now, want)
        new = []
        for page_hash, is_new, digest, expected in zip(page_hashes, written, now, want):
            if is_new:
                value = expected if expected is not None else digest
                self._stored[(pool_name, page_hash)] = value
                new.append(f"{pool_name} {page_hash} {value:016x}\n")
        if new and self._log_path is not None:
            try:
                with os.fdopen(open_private(str(self._log_path), os.O_WRONLY | os.O_APPEND), "a") as log:
                    log.writelines(new)
            except OSError as e:  # the store's directory is gone: keep auditing in memory
                logger.warning("saria KV audit: cannot append to %s (%s); a restart will not audit these pages", self._log_path, e)
                self._log_path = None

    def store_to_host(self, pool_name: str, page_hashes: Sequence[str], host_slots: torch.Tensor, ok: Sequence[bool]) -> None:
        """After a store read into host pages: each equals the page that was stored."""
        pool = self.pools[pool_name]
        pages = self._pages(pool, host_slots)
        read = [(h, p) for h, p, good in zip(page_hashes, pages, ok) if good]
        if not read:
            return
        got = [_digest(pool.host(p)) for _, p in read]
        want = [self._stored.get((pool_name, h)) for h, _ in read]
        self._report(SSD_TO_HOST, pool_name, [h for h, _ in read], got, want)
        for (_, page), digest, expected in zip(read, got, want):
            self._host[(pool_name, int(page[0]))] = expected if expected is not None else digest

    def store_to_device(self, pool_name: str, page_hashes: Sequence[str], device_slots: torch.Tensor) -> None:
        """After a direct store -> device read: the device pages equal the stored pages."""
        want = [self._stored.get((pool_name, h)) for h in page_hashes]
        self._report(SSD_TO_DEVICE, pool_name, list(page_hashes), self.digests(pool_name, device_slots, "device"), want)


def _parse_log_line(line: bytes) -> Optional[tuple[tuple[str, str], int]]:
    """``pool page_hash digest`` (16 hex digits) -> ((pool, page_hash), digest); None if garbled."""
    parts = line.split()
    if len(parts) != 3 or len(parts[2]) != 16:
        return None
    try:
        return (parts[0].decode(), parts[1].decode()), int(parts[2], 16)
    except ValueError:  # not hex, or not UTF-8
        return None


def install_transfer_audit(controller: Any, audit: KVAudit) -> None:
    """Audit every device <-> host copy HiCache's transfer engine runs (write-through,
    promotion, load-back, for KV and mamba pools alike): after submitting, wait for the
    copy (debug mode: the wait is the price of auditing) and check each transfer."""
    engine = controller.l2_transfer_engine
    names = {id(entry.host_pool): name for name, entry in _host_entries(controller)}
    submit_d2h, submit_h2d = engine.submit_device_to_host, engine.submit_host_to_device

    def audited(submit: Callable[..., Any], check: Callable[[str, torch.Tensor, torch.Tensor], None]) -> Callable[..., Any]:
        def run(transfers: list, *args: Any, **kwargs: Any) -> Any:
            completion = submit(transfers, *args, **kwargs)
            completion.finish_event.synchronize()
            for t in transfers:
                name = names.get(id(t.host_pool))
                if name in audit.pools and not t.is_draft and t.host_indices.numel():
                    check(name, t.host_indices, t.device_indices)
            return completion

        return run

    engine.submit_device_to_host = audited(submit_d2h, audit.device_to_host)
    engine.submit_host_to_device = audited(submit_h2d, audit.host_to_device)


def install_kv_audit(controller: Any, backend: Any, on_checked: Callable[..., None]) -> Optional[KVAudit]:
    """SGLANG_SARIA_AUDIT_KV=1: check the bytes of every page moved between device, host and
    store: HiCache's copies, the saria ``backend``'s reads and writes, and (through the radix
    cache) the direct reload's. None, with a warning, without HiCache and the saria store."""
    if controller is None or getattr(backend, "store", None) is None:
        logger.warning("saria: %s=1 needs HiCache with the saria store; KV audit off", AUDIT_ENV)
        return None
    audit = KVAudit(pool_rows_of(controller), on_checked, log_dir=backend.store.config.data_dirs[0])
    install_transfer_audit(controller, audit)
    backend.kv_audit = audit
    logger.info("saria: KV audit on for pools %s", sorted(audit.pools))
    return audit


def attach_audit(audit: Optional[KVAudit], backend: Any) -> None:
    """A storage backend attached at run time: a saria one has its reads and writes checked
    by the server's audit (the transfer audit stays on HiCache's controller); others none."""
    if audit is not None and getattr(backend, "store", None) is not None:
        audit.follow_log(backend.store.config.data_dirs[0])
        backend.kv_audit = audit


def _host_entries(controller: Any) -> list[tuple[str, Any]]:
    """(pool name, host pool entry) of every host pool a HiCache controller moves."""
    host = controller.mem_pool_host
    entries = getattr(host, "entry_map", None)
    if entries:
        return [(str(getattr(name, "value", name)), entry) for name, entry in entries.items()]
    return [("kv", _Entry(host))]


@dataclass(frozen=True)
class _Entry:
    host_pool: Any


def pool_rows_of(controller: Any) -> dict[str, PoolRows]:
    """The audited pools of a HiCache controller, by pool name ("kv", "mamba", ...)."""
    rows = {}
    for name, entry in _host_entries(controller):
        pool = PoolRows.of_host_pool(name, entry.host_pool)
        if pool is not None:
            rows[name] = pool
    return rows
