"""What every step shares: its context, how it fails or skips, and small I/O helpers."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch


class StepFailed(Exception):
    """A check did not hold; the message says which and with what values."""


class StepSkipped(Exception):
    """The step cannot run here; the message names what it needs."""


@dataclass(frozen=True)
class StepContext:
    dry_run: bool
    workdir: Path  # scratch space for store files (removed by the runner)

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    @property
    def cuda(self) -> bool:
        return not self.dry_run

    @property
    def engine(self) -> str:
        return "posix" if self.dry_run else "kvikio"

    def log(self, msg: str) -> None:
        print(msg, flush=True)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise StepSkipped("needs CUDA GPU: torch.cuda.is_available() is False (use --dry-run on CPU hosts)")


def random_bytes(shape: tuple[int, ...], device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).to(device)


def drop_page_cache(paths: Iterable[str]) -> None:
    """Write back and evict the files' cached pages, so timed reads come from the device."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def kvikio_mode() -> dict:
    """kvikio's version and whether reads use GDS or its POSIX compatibility mode."""
    import kvikio
    import kvikio.defaults

    preferred = kvikio.defaults.is_compat_mode_preferred()
    return {
        "kvikio": kvikio.__version__,
        "compat_mode_setting": str(kvikio.defaults.get("compat_mode")),
        "io_mode": "kvikio compat (POSIX, no GDS)" if preferred else "GDS (cuFile)",
    }
