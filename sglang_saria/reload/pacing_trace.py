"""The pacer's record of each direct reload as JSON lines (`transfer.pacing_trace`).

Why: coordinated reload (paper 4.5) is invisible in a server's outputs, which are the same
whether the DRAM and SSD parts of a plan shared the link or not. The trace says, by the
pacer's own clock, how far each reload's SSD reads were let go and how much of its DRAM part
the coordinator's model had copied by then, so an operator (and the server test of pacing)
can check rates and ordering. Written by the reload worker at each job's end, never by the
scheduler thread; the file is private (0600) and appended to by every rank.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from sglang_saria.mem_cache.coordinator import PacedReload

logger = logging.getLogger(__name__)


@dataclass
class PacingTrace:
    """Appends one line per paced reload to ``path``."""

    path: Path
    mode: str  # transfer.mode, so a reader knows which shares to expect
    _failed: bool = field(default=False, init=False)

    def write(self, rid: str, paced: PacedReload, host_gather_bytes: int) -> None:
        """``host_gather_bytes``: the DRAM part this reload's gathers carry (0 when HiCache's
        load_back copies it instead)."""
        record = {
            "rid": rid,
            "pid": os.getpid(),
            "mode": self.mode,
            "dram_bytes": paced.dram_bytes,
            "ssd_bytes": paced.ssd_bytes,
            "host_gather_bytes": host_gather_bytes,
            "begin_t": paced.begin_t,
            "steps": [list(step) for step in paced.steps],
        }
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (json.dumps(record) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as e:  # a trace is a diagnostic: reloads go on without it
            if not self._failed:
                self._failed = True
                logger.warning("saria: pacing trace %s not written (%s); reloads continue untraced", self.path, e)


def read_pacing_trace(path: Path) -> list[dict]:
    """The records of a pacing trace, in the order they were written."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
