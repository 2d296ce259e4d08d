"""Checks on the workers before the router takes traffic.

Why: sglang-router 0.3.2 starts whatever its worker URLs are. An unreachable worker is
retried in the background for `--worker-startup-timeout-secs` (30 minutes) while requests
get 503s, and a worker serving another model gets its share of the sessions and answers
them with that model. Both are configuration mistakes, so the launcher refuses them up
front with a message naming the URL and what it found.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass


class ClusterError(RuntimeError):
    """The cluster's configuration or one of its processes is not usable; the message says which."""


@dataclass(frozen=True)
class WorkerInfo:
    url: str
    model: str  # the served model name (`/v1/models`), what a client's "model" must match


def get_json(url: str, timeout_s: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.load(response)


def served_model(url: str, timeout_s: float = 5.0) -> str:
    """The model a worker serves, as its OpenAI `/v1/models` lists it."""
    models = get_json(f"{url}/v1/models", timeout_s).get("data") or []
    if len(models) != 1:
        raise ClusterError(f"worker {url} lists {len(models)} models on /v1/models, expected one")
    return str(models[0]["id"])


def probe(url: str, timeout_s: float = 5.0) -> WorkerInfo | str:
    """The worker's info, or why it could not be reached (a short reason)."""
    try:
        return WorkerInfo(url, served_model(url, timeout_s))
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code} on /v1/models (is it an SGLang server?)"
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
        return str(getattr(err, "reason", err))
    except (ValueError, KeyError) as err:
        return f"/v1/models is not an OpenAI model list ({err})"


def check_workers(urls: list[str], wait_s: float = 0.0, poll_s: float = 1.0) -> list[WorkerInfo]:
    """Every worker reachable (waiting up to ``wait_s``) and serving the same model."""
    if not urls:
        raise ClusterError("no worker URLs: give --workers N or --worker-urls URL ...")
    deadline = time.monotonic() + wait_s
    while True:
        found = {url: probe(url) for url in urls}
        down = {url: why for url, why in found.items() if isinstance(why, str)}
        if not down or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    if down:
        what = "; ".join(f"{url}: {why}" for url, why in down.items())
        scope = "no worker is reachable" if len(down) == len(urls) else f"{len(down)} of {len(urls)} workers are not reachable"
        raise ClusterError(f"{scope} ({what}): start them first or fix --worker-urls")
    infos = [found[url] for url in urls]
    models = {info.model for info in infos}
    if len(models) > 1:
        listing = ", ".join(f"{info.url} serves '{info.model}'" for info in infos)
        raise ClusterError(
            f"workers serve different models ({listing}): the router would send a session to either; "
            "start every worker with the same --model-path (or the same --served-model-name)"
        )
    return infos
