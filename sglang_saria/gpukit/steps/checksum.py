"""Step checksum: pages read by the store into device memory, verified there by the digest
kernel against the digests the store recorded at write time (one bool per page to the host)."""

from __future__ import annotations

import torch

from sglang_saria.gpukit.steps.common import StepContext, check, random_bytes, require_cuda
from sglang_saria.gpukit.steps.store import open_store
from sglang_saria.gpukit.timing import gbps, median_seconds, sig
from sglang_saria.digest import digest
from sglang_saria.kernels.checksum import row_digests, verify_rows


def run(ctx: StepContext) -> dict:
    if ctx.cuda:
        require_cuda()
        pages, page_bytes, repeats = 64, 2 << 20, 7
    else:
        pages, page_bytes, repeats = 4, 16 << 10, 1  # times the interpreter: exercises the code only
        ctx.log("dry run: interpreted kernel on CPU pages; on a GPU host this step times the digest over 128 MiB")
    src = random_bytes((pages, page_bytes), ctx.device, seed=3)
    with open_store(ctx, "checksum", page_bytes, pages) as store:
        keys = [f"page{i}" for i in range(pages)]
        check(all(f.result().ok for f in store.put_batch([(k, src[i]) for i, k in enumerate(keys)])), "puts failed")
        recorded = [store.digest_of(k) for k in keys]
        staging = torch.empty_like(src)
        check(all(f.result().ok for f in store.get_batch(keys, list(staging))), "reads failed")
    host = src.cpu().numpy()
    check(all(digest(host[i]) == recorded[i] for i in range(pages)), "the store's recorded digests differ from numpy's")
    ok = verify_rows(staging, recorded, backend="triton")
    check(bool(ok.all()), f"device digests differ from the store's on pages {(~ok).nonzero().flatten().tolist()[:5]}")
    staging[pages // 2, 12345 % page_bytes] ^= 1
    flagged = (~verify_rows(staging, recorded, backend="triton")).nonzero().flatten().tolist()
    check(flagged == [pages // 2], f"one flipped bit in page {pages // 2} flagged pages {flagged}")
    figures = {"pages": pages, "page_mib": page_bytes / 2**20, "device_matches_store": True, "flip_detected": True}
    t_digest = median_seconds(lambda: row_digests(staging, backend="triton"), repeats, ctx.cuda)
    t_sum = median_seconds(lambda: staging.view(torch.int32).sum(dim=1, dtype=torch.int64), repeats, ctx.cuda)
    figures.update(
        digest_gbps=sig(gbps(staging.numel(), t_digest)),
        torch_sum_gbps=sig(gbps(staging.numel(), t_sum)),
        digest_vs_torch_sum=sig(t_sum / t_digest),
    )
    return figures
