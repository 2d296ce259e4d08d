"""A scenario's saria store, kept as the scenario left it for the scenarios that start from it."""

from __future__ import annotations

import shutil
from pathlib import Path


class KeptStore:
    """Snapshot of a store directory. `restored()` puts it back at its own path (the
    store's index records its data dirs), so each later scenario starts from the same
    state whatever the ones before it wrote or corrupted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._snapshot = path.with_name(path.name + "-as-left")
        shutil.copytree(path, self._snapshot)

    def restored(self) -> Path:
        shutil.rmtree(self.path)
        shutil.copytree(self._snapshot, self.path)
        return self.path
