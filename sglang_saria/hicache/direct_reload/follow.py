"""One reload per page in flight: a request whose stored pages another request's
reload is reading already waits for that reload, instead of reading them again.

`SariaRadixCache._probe` finds the leader (`PendingReloads.leader_of`) and registers the request
as its follower with a `Follower`: what the request needs to probe again. The follower waits in
the queue as the leader's own request does. When the leader's reload ends, `resume` matches the
follower's tokens against the tree as it is now: the pages the leader published are device
nodes, so they are a device hit, and only the stored pages past them are probed and read, in a
reload of the follower's own. A follower whose match shrank meanwhile (its device pages
evicted) goes back to SGLang's prefetch retry instead, which probes from the new match.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Optional

from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey


@dataclass(frozen=True)
class Follower:
    """A request waiting for another's reload: its tokens from the root (page-aligned, up to its
    longest reusable prefix), its match at arrival (``start`` tokens), the page hashes past it
    and the hash before them, and its namespace."""

    request: Any  # SGLang's CacheRequestHandle
    tokens: tuple[int, ...]
    start: int
    hashes: tuple[str, ...]
    last_hash: Optional[str]
    extra_key: Optional[str] = None
    cache_salt: Optional[str] = None

    def hash_before(self, end: int, page: int) -> Optional[str]:
        """The page hash ending at token ``end`` (>= ``start``), from the chain known at arrival."""
        pages = (end - self.start) // page
        return self.hashes[pages - 1] if pages else self.last_hash


def resume(cache: Any, follower: Follower) -> int:
    """The leader's reload ended (published or released): probe ``follower`` again from its
    match now, and track the reload of what is still stored past it (none: the request is
    admitted with what it matches). ``cache``: the `SariaRadixCache`, inside `check_hicache_events`.
    Returns the tokens its match covers now (0 where SGLang's prefetch retry probes it again)."""
    page = cache.page_size
    key = RadixKey(array("q", follower.tokens), extra_key=follower.extra_key, cache_salt=follower.cache_salt)
    result = cache.match_prefix(MatchPrefixParams(key=key))  # no request: its reuse was counted at arrival
    matched = result.device_prefix_len + result.host_hit_length
    anchor = result.last_host_node
    if matched < follower.start or (matched - follower.start) % page:
        cache.storage_prefetch_retries.refetch(follower.request.rid)  # SGLang probes from its new match
        return 0
    last_hash = follower.hash_before(matched, page)
    prefix, rest = list(follower.tokens[:matched]), list(follower.tokens[matched:])
    pending = cache._probe(follower.request, anchor, prefix, rest, last_hash, follower.extra_key, follower.cache_salt)
    if pending is None:
        return matched
    if not cache.is_backuped(anchor) and not cache.is_root(anchor):
        # A device-only anchor (the leader's published pages): its host lock holds nothing, so the
        # device path is locked until the reload is claimed (never inside a prefill batch being
        # built: this runs in check_hicache_events).
        pending.anchor_lock = cache.inc_lock_ref(anchor).to_dec_params()
    cache._reloads.track(pending)
    return matched
