"""What the server fault tests share: the prompt whose pages are stored, the tiers it is served
from, a store's extra config, and samples of `/metrics` by label."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PAGE = 16
PROMPT = list(range(1, 301))  # 18 full pages of 16 tokens (the last, partial page is recomputed)
STORED = 288
COMPUTED = {"device": 0, "host": 0, "storage": 0}
FROM_STORAGE = {"device": 0, "host": 0, "storage": STORED}


def other_prompt(n: int) -> list[int]:
    """The ``n``-th traffic prompt: 300 tokens sharing no page with PROMPT or another one."""
    return [(1000 + 37 * n + 7 * i) % 1019 + 3 for i in range(300)]


def store_config(path: Path, **extra: Any) -> dict[str, Any]:
    return {"data_dirs": [str(path)], "admission": "full-duplicate", "capacity": "64MiB", **extra}


def sample(metrics_text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample_labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
