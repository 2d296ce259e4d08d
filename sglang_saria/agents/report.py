"""SGLang's own cache report of an OpenAI-style response, by tier.

Why: a user judges the cache by what the server reports per request, not by our metrics.
With `--enable-cache-report` SGLang puts the cached prompt tokens in
`usage.prompt_tokens_details.cached_tokens`; a request with `return_cached_tokens_details`
also gets them split by tier (device, host, storage) in `sglext.cached_tokens_details`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

# Ask SGLang for the per-tier split (an SGLang extension of the OpenAI request).
CACHE_DETAILS = {"return_cached_tokens_details": True}
TIERS = ("device", "host", "storage")


def _as_dict(obj: Any) -> dict:
    """OpenAI SDK objects and plain JSON dicts alike."""
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    return obj.model_dump()


@dataclass
class CacheReport:
    prompt_tokens: int
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens
    device: int = 0
    host: int = 0
    storage: int = 0

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def tiers(self) -> dict[str, int]:
        return {tier: getattr(self, tier) for tier in TIERS}

    @classmethod
    def from_response(cls, response: Any) -> "CacheReport":
        """From a chat/completions response (non-streaming)."""
        return cls.from_parts(_as_dict(response))

    @classmethod
    def from_stream(cls, chunks: Iterable[Any]) -> "CacheReport":
        """From a streamed response's chunks (usage and sglext come in the last ones)."""
        merged: dict = {}
        for chunk in chunks:
            data = _as_dict(chunk)
            for key in ("usage", "sglext"):
                if data.get(key):
                    merged[key] = data[key]
        return cls.from_parts(merged)

    @classmethod
    def from_parts(cls, data: dict) -> "CacheReport":
        usage = data.get("usage")
        if not usage:
            raise ValueError("response has no usage block (streaming needs stream_options.include_usage)")
        details = usage.get("prompt_tokens_details")
        if details is None:
            raise ValueError("usage has no prompt_tokens_details: start the server with --enable-cache-report")
        tiers = (data.get("sglext") or {}).get("cached_tokens_details") or {}
        return cls(
            prompt_tokens=int(usage["prompt_tokens"]),
            cached_tokens=int(details.get("cached_tokens") or 0),
            **{tier: int(tiers.get(tier) or 0) for tier in TIERS},
        )
