"""``auto`` admission's learned state across restarts, kept with the store it decided for.

The page counters (``counter_log.py``) carry each page's history; ``auto`` (``mem_cache/learned.py``)
also learns, per class of block, how often an evicted block is wanted again, and tracks the blocks
it saw evicted (its ghost). Without this module a restarted server would start from the Laplace
prior (every class at chance 1/2) and an empty ghost.

- save (``AdmissionStateFile.save``, from ``SariaRuntime.end_step``): at the first step, then at most
  every ``admission.auto_state_save_s`` seconds (60), and when the store closes (a server killed
  loses at most that much learning). The scheduler thread only copies the state (C-speed copies,
  ``LearnedAdmission.snapshot``); a background thread writes it as JSON to a private file (0600)
  beside the store's index, through a temporary file and a rename, so a crash leaves the last
  complete file. One write at a time: a save while the last one runs is skipped.
- load (``AdmissionStateFile.load``, where the runtime is built): a missing file is a first start;
  a damaged or incompatible one is logged (file and field) and ignored, never an error (a bad
  file must not stop the server).

With several attention ranks each rank keeps its own file in its own store directory: they save
at the same steps, so the ranks restore the same state unless one was killed between two saves.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from sglang_saria.config import ConfigError
from sglang_saria.storage.private import open_private

logger = logging.getLogger(__name__)

FILE_NAME = "auto-admission.json"


class AdmissionStateFile:
    """Loads and saves a learning admission's ``state_dict`` at ``path``."""

    def __init__(self, admission: Any, path: str, clock: Callable[[], float] = time.monotonic,
                 every_s: float = 60.0) -> None:
        self.admission = admission
        self.path = path
        self.clock = clock
        self.every_s = every_s
        self._saved_at: Optional[float] = None
        self._writer: Optional[threading.Thread] = None
        self.saves = 0  # files written by this process

    def load(self) -> bool:
        """Restore the state the file holds; False (logged) when there is none or it is unusable."""
        try:
            with open(self.path, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as e:
            logger.warning("saria: %s: auto admission state not restored (%s); it learns from scratch", self.path, e)
            return False
        try:
            self.admission.load_state_dict(state, self.path)
        except ConfigError as e:
            logger.warning("saria: auto admission state not restored: %s; it learns from scratch", e)
            return False
        logger.info("saria: auto admission state restored from %s (%d ghost blocks)", self.path,
                    len(self.admission.ghost))
        return True

    def save(self, force: bool = False) -> None:
        """Every ``every_s`` (or now, ``force``): the state goes to the file from a background thread."""
        now = self.clock()
        if not force and self._saved_at is not None and now - self._saved_at < self.every_s:
            return
        if self._writer is not None and self._writer.is_alive():
            if not force:
                return
            self._writer.join()
        self._saved_at = now
        build = self.admission.snapshot()
        self._writer = threading.Thread(target=self._write, args=(build,), name="saria-auto-state", daemon=True)
        self._writer.start()
        if force:
            self._writer.join()

    def _write(self, build: Callable[[], dict]) -> None:
        tmp = f"{self.path}.tmp"
        try:
            data = json.dumps(build(), separators=(",", ":")).encode()
            fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            self.saves += 1
        except OSError as e:
            logger.warning("saria: %s: auto admission state not saved: %s", self.path, e)


def admission_state_file(admission: Any, data_dir: str, clock: Callable[[], float],
                         every_s: float) -> Optional[AdmissionStateFile]:
    """The state file of ``admission`` in the store directory ``data_dir``, its state restored, saved at
    most every ``every_s`` seconds; None for a policy without learned state."""
    if not callable(getattr(admission, "snapshot", None)):
        return None
    state_file = AdmissionStateFile(admission, os.path.join(data_dir, FILE_NAME), clock, every_s)
    state_file.load()
    return state_file
