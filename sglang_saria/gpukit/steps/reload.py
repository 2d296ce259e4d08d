"""Step reload: SSD pages into a device KV pool shaped like SGLang's (plain tensors).

Direct (store -> device staging -> gather into the pool, `reload/device.py`) is timed
against HiCache's staging (store -> pinned host pool -> per-layer copies), in the same run.
Then the link rates are measured (store reads into device memory; pinned host -> device
copies), and a half-DRAM half-SSD reload runs under the coordinator's pacer with those rates:
the pacer must hold SSD reads to the model's GDS rate, and the wall time is set against the
model's completion time.
"""

from __future__ import annotations

import time

import torch

from sglang_saria.config import BandwidthConfig
from sglang_saria.gpukit.steps.common import StepContext, check, require_cuda
from sglang_saria.gpukit.steps.store import open_store
from sglang_saria.gpukit.timing import gbps, median_seconds, sig
from sglang_saria.gpukit.workloads import PAGE, Pools, staged
from sglang_saria.mem_cache.coordinator import RealTimePacer, TransferCoordinator
from sglang_saria.reload.device import DeviceReloader
from sglang_saria.storage.store import SariaStore

MODE = "coordinated"


def pool_holds(pools: Pools, slots: torch.Tensor, pages: list[torch.Tensor]) -> bool:
    """Page n (stored as [2, layers, PAGE, heads, dim]) sits in slots[n*PAGE:(n+1)*PAGE] of every layer."""
    for n, page in enumerate(pages):
        rows = slots[n * PAGE : (n + 1) * PAGE].to(pools.k_buffer[0].device)
        kv = page.view(2, pools.layers, PAGE, *pools.k_buffer[0].shape[1:])
        for layer in range(pools.layers):
            if not (torch.equal(pools.k_buffer[layer][rows].cpu(), kv[0, layer]) and torch.equal(pools.v_buffer[layer][rows].cpu(), kv[1, layer])):
                return False
    return True


def clear(pools: Pools) -> None:
    for t in pools.k_buffer + pools.v_buffer:
        t.zero_()


def link_rates(ctx: StepContext, store: SariaStore, keys: list[str], page_bytes: int, repeats: int) -> tuple[float, float]:
    """Measured GB/s of store reads into device memory and of pinned host -> device copies."""
    dst = torch.empty((len(keys), page_bytes), dtype=torch.uint8, device=ctx.device)
    t_ssd = median_seconds(lambda: [f.result() for f in store.get_batch(keys, list(dst))], repeats, ctx.cuda)
    host = torch.empty_like(dst, device="cpu")
    host = host.pin_memory() if ctx.cuda else host
    t_h2d = median_seconds(lambda: dst.copy_(host, non_blocking=True), repeats, ctx.cuda)
    return gbps(dst.numel(), t_ssd), gbps(dst.numel(), t_h2d)


def paced_reload(reloader: DeviceReloader, keys: list[str], slots: torch.Tensor, bw: BandwidthConfig, page_bytes: int) -> dict:
    """First half of the pages from the host pool, second half from SSD, paced by the coordinator."""
    half = len(keys) // 2
    dram_bytes, ssd_bytes = half * page_bytes, (len(keys) - half) * page_bytes
    pacer = RealTimePacer(bw, MODE)
    rid = pacer.begin(dram_bytes, ssd_bytes)
    start = time.perf_counter()
    outcome = reloader.load(keys[half:], slots[half * PAGE :], torch.arange(half * PAGE), slots[: half * PAGE],
                            pace=lambda done: pacer.pace_ssd(rid, done))
    wall = time.perf_counter() - start
    pacer.end(rid)
    check(outcome.ok, f"paced reload failed: {outcome.reason}")
    model = TransferCoordinator.single_request_time(bw, MODE, dram_bytes, ssd_bytes)
    ssd_floor = ssd_bytes / (min(bw.gds_gbps, bw.ingress_gbps) * 1e9)
    check(wall >= 0.98 * ssd_floor, f"SSD reads ran ahead of the pacer: {wall:.4f} s < model SSD time {ssd_floor:.4f} s")
    return {"paced_wall_s": sig(wall), "model_s": sig(model), "wall_vs_model": sig(wall / model),
            "pacer_slept_s": sig(pacer.slept_s)}


def run(ctx: StepContext) -> dict:
    if ctx.cuda:
        require_cuda()
        n, layers, repeats = 64, 32, 5
    else:
        n, layers, repeats = 8, 2, 3
        ctx.log("dry run: CPU pools, POSIX reads; on a GPU host this step times 64 pages x 32 layers (128 MiB)")
    page_bytes = Pools.page_bytes(layers)
    gen = torch.Generator().manual_seed(7)
    pages = [torch.randn(page_bytes // 2, generator=gen).to(torch.bfloat16) for _ in range(n)]
    keys = [f"page{i}" for i in range(n)]
    with open_store(ctx, "reload", page_bytes, n) as store:
        check(all(f.result().ok for f in store.put_batch(list(zip(keys, pages)))), "puts failed")
        pools = Pools(n, layers, ctx.device)
        slots = torch.arange(PAGE, (n + 1) * PAGE)
        reloader = DeviceReloader(store.get_async, pools, "page_first_direct", PAGE, page_bytes, host_pool=pools)
        t_staged = median_seconds(lambda: staged(store, pools, reloader, keys, list(range(n)), slots), repeats, ctx.cuda)
        check(pool_holds(pools, slots, pages), "host-staged reload: pool slots differ from the stored pages")
        clear(pools)
        t_direct = median_seconds(lambda: check(reloader.load(keys, slots).ok, "direct reload failed"), repeats, ctx.cuda)
        check(pool_holds(pools, slots, pages), "direct reload: pool slots differ from the stored pages")
        gds, h2d = link_rates(ctx, store, keys, page_bytes, repeats)
        bw = BandwidthConfig(ingress_gbps=h2d, gds_gbps=gds, dram_gbps=h2d)
        clear(pools)
        figures = paced_reload(reloader, keys, slots, bw, page_bytes)  # host pool holds the pages since `staged`
        check(pool_holds(pools, slots, pages), "paced DRAM + SSD reload: pool slots differ from the stored pages")
    total = n * page_bytes
    figures.update(
        pages=n, page_mib=page_bytes / 2**20, engine=ctx.engine,
        staged_gbps=sig(gbps(total, t_staged)), direct_gbps=sig(gbps(total, t_direct)),
        direct_vs_staged=sig(t_staged / t_direct), ssd_to_device_gbps=sig(gds), h2d_gbps=sig(h2d),
    )
    return figures
