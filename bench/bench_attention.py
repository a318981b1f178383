"""Attention of one sample, fused (runtime/models/reference.py `attend`: torch's scaled_dot_product_attention)
against the materialised scores it replaced (einsum, mask, softmax, einsum): forward+backward seconds and the
peak memory over the inputs, per length, each measured in a fresh process (peak RSS on the CPU; the
allocator's peak on CUDA). Same run, same shapes; ratios are fused over materialised.

    .venv/bin/python bench/bench_attention.py [--lengths 512 2048 8192] [--heads 4] [--head-dim 16]

Writes bench/out/attention.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path


def materialised(q, k, v, causal):  # type: ignore[no-untyped-def]
    import torch

    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[0]
        hidden = torch.arange(n).unsqueeze(0) > torch.arange(n).unsqueeze(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def one(kind: str, length: int, heads: int, head_dim: int, device: str, reps: int) -> dict[str, float]:
    import resource

    import torch

    from orch.runtime.models.reference import attend

    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(length, heads, head_dim, generator=gen).to(dev).requires_grad_() for _ in range(3))

    def step() -> None:
        out = attend(q, k, v, 1, True, 0) if kind == "fused" else materialised(q, k, v, True)
        out.sum().backward()

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    step()  # warm-up, and the peak
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t)
    return {"seconds": statistics.median(times), "peak_bytes": float(max(peak, 0))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--one", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.heads, args.head_dim, args.device, args.reps)))
        return
    rows = []
    for n in args.lengths:
        got = {}
        for kind in ("materialised", "fused"):  # each in its own process: a clean peak
            cmd = [sys.executable, __file__, "--one", kind, str(n), "--heads", str(args.heads),
                   "--head-dim", str(args.head_dim), "--device", args.device, "--reps", str(args.reps)]  # fmt: skip
            got[kind] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        rows.append({"length": n, **got})
    print(
        f"causal attention, {args.heads} heads x {args.head_dim}, fp32, {args.device}, fwd+bwd, median of {args.reps}"
    )
    print(f"{'length':>7} {'materialised s':>15} {'fused s':>9} {'ratio':>6} {'materialised MB':>16} {'fused MB':>9}")
    for r in rows:
        a, b = r["materialised"], r["fused"]
        print(
            f"{r['length']:>7} {a['seconds']:>15.4f} {b['seconds']:>9.4f} {b['seconds'] / a['seconds']:>6.2f} "
            f"{a['peak_bytes'] / 1e6:>16.1f} {b['peak_bytes'] / 1e6:>9.1f}"
        )
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "attention.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
