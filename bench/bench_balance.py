"""Benchmark of the batch post-balancing dispatcher (issue 3): none / lpt / kk / paper / orch.

Generates realistic multimodal global batches (text-only, image, video, ASR and audio-visual
samples with log-normal long tails; and a capped mix where the mean rather than one giant sample
sets the bound), balances every phase with each mode, and prints per mix, size and phase:
max cost ÷ lower bound, inter-node bytes ÷ all bytes of the phase, and seconds (median of
--repeat runs for orch; one run for the slow references). Writes bench/out/bench_balance.json.

    .venv/bin/python bench/bench_balance.py            # the full table (several minutes: KK is slow)
    .venv/bin/python bench/bench_balance.py --quick    # small sizes only
    .venv/bin/python bench/bench_balance.py --size 2560x16 --only-orch --repeat 7   # the 50 ms check, seconds
    .venv/bin/python bench/bench_balance.py --size 2560x16 --only-orch --baseline main   # before/after, one run
    .venv/bin/python bench/bench_balance.py --items --baseline main   # samples listing items: by sample vs by item

--baseline REF also runs the dispatcher as git commit REF has it (planner/balance/ imported beside
today's), on the same batches in the same process, just before today's: both tables and a
before -> after comparison print.

--size RANKSxPER (repeatable) runs only those sizes; --only-orch leaves out the reference modes
(none, lpt, kk, paper: their columns print '-', and the summary's comparisons with them are left
out), for a quick look at orch's time and quality. Either writes the JSON only when --out is given.

Targets (issue 3): orch max within 1% of min(LPT, KK) on every case; orch inter-node bytes at most
1/10 of paper's on the median case and 1/4 on the worst; all phases of 2,560 × 16 under 50 ms.
Run it on one thread: OMP_NUM_THREADS=1 (numpy here does not thread these ops anyway). The
all-phases time is reported per mix as wall time and as this process's CPU time (the median of
--repeat runs each); on a shared, busy machine the CPU time is the one to read.
--skip-kk-above N leaves KK out for phases of more than N samples (it is O(n·N)); the summary says
how many cases were compared with KK.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orch.planner.balance.batch import LLM_PHASE, PhaseSpec
from orch.planner.balance.cost import PhaseArrays, build_phase_arrays, lower_bound, moved_bytes, rank_costs
from orch.planner.balance.dispatch import balance_arrays, dispatch_phase
from orch.planner.balance.items import Items, group_phase, item_costs, item_lower_bound, whole_groups
from orch.planner.balance.mode import Mode
from orch.planner.research.karmarkar_karp import karmarkar_karp

PHASES = {
    "vision": PhaseSpec(linear=1.0, quadratic=1 / 4096),
    "audio": PhaseSpec(linear=1.0, quadratic=0.0, padded=True),
    LLM_PHASE: PhaseSpec(linear=1.0, quadratic=1 / 8192),
}
BYTES_PER_TOKEN = {"vision": 2048, "audio": 2560, LLM_PHASE: 2048}


@dataclass(frozen=True)
class Task:
    weight: float
    tokens: dict[str, tuple[int, int]]  # phase -> (mean, cap): a log-normal draw, clipped to [1, cap]
    sigma: float = 0.7
    # phase -> (sizes, images): the phase's length is the sum of 1..images draws from a handful of
    # sizes (fixed-resolution images, or a native-resolution tower's patches from a few resolutions)
    sizes: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)
    # phase -> (fewest frames, most frames, tokens per temporal patch group of 2 frames): a video, its
    # frame groups in runs of at most VIDEO_RUN_TOKENS (the items it is balanced by); the LLM gets a
    # quarter of its tokens (2x2 merge) on top of its own draw
    video: dict[str, tuple[int, int, int]] = field(default_factory=dict)


# a native-resolution tower (14-px patches, 2x2 merged): patches, multiples of 4, of a few common resolutions
_NATIVE = tuple(4 * (h // 28) * (w // 28) for h, w in ((448, 448), (672, 448), (896, 672), (1344, 896), (224, 224)))


MIXES: dict[str, list[Task]] = {
    # templates/data/omni-mix.yaml: captions, images, video, ASR, audio-visual
    "omni": [
        Task(0.25, {LLM_PHASE: (900, 8192)}),
        Task(0.30, {"vision": (1024, 4096), LLM_PHASE: (500, 4096)}),
        Task(0.15, {"vision": (8192, 32768), LLM_PHASE: (2300, 8192)}),
        Task(0.20, {"audio": (1500, 6000), LLM_PHASE: (900, 4096)}),
        Task(0.10, {"vision": (4096, 16384), "audio": (1500, 6000), LLM_PHASE: (2000, 8192)}),
    ],
    "video-heavy": [
        Task(0.20, {LLM_PHASE: (700, 8192)}, sigma=1.0),
        Task(0.20, {"vision": (1024, 4096), LLM_PHASE: (400, 4096)}, sigma=1.0),
        Task(0.45, {"vision": (6144, 32768), LLM_PHASE: (1500, 8192)}, sigma=1.0),
        Task(0.15, {"vision": (3072, 16384), "audio": (2000, 6000), LLM_PHASE: (1500, 8192)}, sigma=1.0),
    ],
    "asr-heavy": [
        Task(0.30, {LLM_PHASE: (1200, 8192)}),
        Task(0.50, {"audio": (2500, 12000), LLM_PHASE: (600, 4096)}, sigma=0.9),
        Task(0.20, {"vision": (1024, 4096), LLM_PHASE: (500, 4096)}),
    ],
    # capped: many equal small samples (fixed 576-token images, clips at their cap), so the
    # mean per rank, not the largest sample, sets the lower bound
    "capped": [
        Task(0.40, {"vision": (576, 576), LLM_PHASE: (600, 2048)}),
        Task(0.10, {"vision": (2304, 2304), LLM_PHASE: (1200, 2048)}, sigma=0.3),
        Task(0.25, {LLM_PHASE: (1500, 2048)}),
        Task(0.25, {"audio": (1200, 1500), LLM_PHASE: (400, 1024)}),
    ],
    # caption-heavy: mostly image-caption pairs (one image, a short caption), short text, a few long
    # samples; many small samples of similar size, so the mean sets the bound and the LLM phase is
    # made of tiny sequences (the refinement and repair loops have the most to do)
    "caption-heavy": [
        Task(0.70, {"vision": (729, 2304), LLM_PHASE: (120, 512)}, sigma=0.4),
        Task(0.20, {LLM_PHASE: (300, 1024)}),
        Task(0.10, {"vision": (1024, 4096), LLM_PHASE: (900, 2048)}),
    ],
    # tie-heavy mixes (issue 33): many samples of exactly equal size
    # three-sizes: every image one of 3 sizes (256, 576 or 1024 tokens), one or two per sample
    "three-sizes": [
        Task(0.75, {LLM_PHASE: (600, 2048)}, sizes={"vision": ((256, 576, 1024), 2)}),
        Task(0.15, {LLM_PHASE: (900, 2048)}),
        Task(0.10, {"audio": (1200, 1500), LLM_PHASE: (400, 1024)}),
    ],
    # capped-lengths: long tails clipped low, so a large share of every phase sits exactly at its cap
    "capped-lengths": [
        Task(0.60, {"vision": (1024, 1024), LLM_PHASE: (1024, 1024)}, sigma=1.0),
        Task(0.25, {LLM_PHASE: (2048, 2048)}, sigma=1.0),
        Task(0.15, {"audio": (1500, 1500), LLM_PHASE: (512, 512)}, sigma=1.0),
    ],
    # native-res: a native-resolution vision tower, 1-4 images each from 5 resolutions (patches x4)
    "native-res": [
        Task(0.70, {LLM_PHASE: (500, 4096)}, sizes={"vision": (_NATIVE, 4)}),
        Task(0.20, {LLM_PHASE: (1200, 4096)}),
        Task(0.10, {LLM_PHASE: (300, 1024)}, sizes={"vision": (_NATIVE, 1)}),
    ],
}

# mixes whose samples list their items (images, runs of a video's frame groups): `--items` balances them by item
ITEM_MIXES: dict[str, list[Task]] = {
    # long-video: 15% videos of 64-768 frames at 24 x 24 patches per frame group, images and text the rest
    "long-video": [
        Task(0.15, {LLM_PHASE: (300, 2048)}, video={"vision": (64, 768, 576)}),
        Task(0.55, {LLM_PHASE: (500, 4096)}, sizes={"vision": (_NATIVE, 4)}),
        Task(0.30, {LLM_PHASE: (900, 8192)}),
    ],
    # caption-pretrain: captions on a few fixed image sizes, a long tail of text documents, ASR clips
    "caption-pretrain": [
        Task(0.60, {LLM_PHASE: (80, 256)}, sizes={"vision": ((256, 576, 729, 1024), 1)}),
        Task(0.30, {LLM_PHASE: (1500, 32768)}, sigma=1.5),
        Task(0.10, {"audio": (1500, 1500), LLM_PHASE: (300, 1024)}),
    ],
    # sft-tiles: capped-length SFT, images as 1-7 tiles of 576 tokens, sequences capped at 4,096
    "sft-tiles": [
        Task(0.60, {LLM_PHASE: (1200, 4096)}, sizes={"vision": ((576,), 7)}),
        Task(0.40, {LLM_PHASE: (2000, 4096)}, sigma=1.0),
    ],
    "three-sizes": MIXES["three-sizes"],
    "native-res": MIXES["native-res"],
}
VIDEO_RUN_TOKENS = 8192

SIZES = [(64, 16), (512, 8), (512, 32), (2560, 8), (2560, 16)]
QUICK_SIZES = [(16, 8), (64, 16), (256, 16)]
MODES = ("none", "lpt", "kk", "paper", "orch")


def make_batch(mix: str, num_ranks: int, per_rank: int, dp_per_node: int = 8, seed: int = 0):
    """Phase arrays of one random global batch: per_rank samples on each rank, as DP sampling gives."""
    rng = np.random.default_rng(seed)
    tasks = MIXES[mix]
    n = num_ranks * per_rank
    weights = np.array([t.weight for t in tasks])
    kind = rng.choice(len(tasks), size=n, p=weights / weights.sum())
    origin = np.repeat(np.arange(num_ranks), per_rank)
    phases: dict[str, PhaseArrays] = {}
    for name, spec in PHASES.items():
        lengths = np.zeros(n, dtype=np.int64)
        for k, task in enumerate(tasks):
            sel = np.flatnonzero(kind == k)
            if name in task.sizes:
                choices, most = task.sizes[name]
                count = rng.integers(1, most + 1, size=sel.size)
                draws = rng.choice(np.asarray(choices, dtype=np.int64), size=(sel.size, most))
                lengths[sel] = (draws * (np.arange(most)[None, :] < count[:, None])).sum(axis=1)
                continue
            if name not in task.tokens:
                continue
            mean, cap = task.tokens[name]
            draw = mean * np.exp(rng.normal(-(task.sigma**2) / 2, task.sigma, size=sel.size))
            lengths[sel] = np.clip(np.rint(draw), 1, cap).astype(np.int64)
        bytes_ = lengths * BYTES_PER_TOKEN[name]
        phases[name] = build_phase_arrays(name, spec, lengths, origin, bytes_, num_ranks, dp_per_node)
    return phases, origin


def make_item_batch(
    mix: str, num_ranks: int, per_rank: int, dp_per_node: int = 8, seed: int = 0
) -> tuple[dict[str, PhaseArrays], np.ndarray, dict[str, Items]]:
    """Phase arrays (every sample whole, costing the sum of its items') and each listing phase's items."""
    rng = np.random.default_rng(seed)
    tasks = ITEM_MIXES[mix]
    n = num_ranks * per_rank
    weights = np.array([t.weight for t in tasks])
    kind = rng.choice(len(tasks), size=n, p=weights / weights.sum())
    origin = np.repeat(np.arange(num_ranks), per_rank)
    per_sample: dict[str, list[list[int]]] = {name: [[] for _ in range(n)] for name in PHASES}
    for k, task in enumerate(tasks):
        sel = np.flatnonzero(kind == k)
        for name in PHASES:
            if name in task.sizes:
                choices, most = task.sizes[name]
                count = rng.integers(1, most + 1, size=sel.size)
                draws = rng.choice(np.asarray(choices, dtype=np.int64), size=(sel.size, most))
                for j, i in enumerate(sel.tolist()):
                    per_sample[name][i] = draws[j, : count[j]].tolist()
            elif name in task.video:
                low, high, group = task.video[name]
                frames = rng.integers(low, high + 1, size=sel.size)
                run = max(1, VIDEO_RUN_TOKENS // group)
                for j, i in enumerate(sel.tolist()):
                    groups = int(frames[j]) // 2
                    per_sample[name][i] = [run * group] * (groups // run) + (
                        [groups % run * group] if groups % run else []
                    )
            elif name in task.tokens:
                mean, cap = task.tokens[name]
                draw = mean * np.exp(rng.normal(-(task.sigma**2) / 2, task.sigma, size=sel.size))
                for j, i in enumerate(sel.tolist()):
                    per_sample[name][i] = [int(np.clip(np.rint(draw[j]), 1, cap))]
        for i in sel.tolist():  # the LLM reads a quarter of a video's tokens
            if task.video:
                per_sample[LLM_PHASE][i][0] += sum(sum(per_sample[v][i]) for v in task.video) // 4
    phases: dict[str, PhaseArrays] = {}
    items: dict[str, Items] = {}
    for name, spec in PHASES.items():
        lists = per_sample[name]
        if name != LLM_PHASE:
            its = Items.from_lists(lists, [[v * BYTES_PER_TOKEN[name] for v in x] for x in lists])
            costs = item_costs(its, spec)
            phases[name] = group_phase(name, spec, its, costs, whole_groups(its), origin, num_ranks, dp_per_node)
            items[name] = its
            continue
        lengths = np.array([sum(x) for x in lists], dtype=np.int64)
        phases[name] = build_phase_arrays(
            name, spec, lengths, origin, lengths * BYTES_PER_TOKEN[name], num_ranks, dp_per_node
        )
    return phases, origin, items


def run_item_case(
    mix: str, num_ranks: int, per_rank: int, repeat: int,
    before: Callable[[PhaseArrays, Mode], np.ndarray] | None = None,
) -> list[dict]:  # fmt: skip
    """Per phase: orch by sample and by item, max / LB at item granularity, bytes across nodes, ms; all
    phases by item (wall and CPU, medians of `repeat`), and with `before` (a dispatcher from git) every
    phase by whole sample as it balanced them."""
    phases, origin, items = make_item_batch(mix, num_ranks, per_rank)

    def timed(fn: Callable[[], object]) -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(repeat):
            start, cpu = time.perf_counter(), time.process_time()
            fn()
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)
        return statistics.median(walls), statistics.median(cpus)

    wall, cpu = timed(lambda: balance_arrays(phases, origin, Mode.ORCH, items))
    before_cpu = None
    if before is not None:
        _, before_cpu = timed(lambda: {name: before(ph, Mode.ORCH) for name, ph in phases.items()})
    by_item = balance_arrays(phases, origin, Mode.ORCH, items)
    by_sample = balance_arrays(phases, origin, Mode.ORCH, items, by_item=False)
    rows = []
    for name, ph in phases.items():
        its = items.get(name)
        lb = item_lower_bound(item_costs(its, ph.spec), ph.num_ranks) if its is not None else lower_bound(ph)
        total = int(ph.bytes.sum())
        o_item, o_sample = by_item[name], by_sample[name]
        rows.append(
            {
                "mix": mix, "ranks": num_ranks, "per_rank": per_rank, "phase": name, "samples": ph.n,
                "items": its.n if its is not None else ph.n,
                "none_over_item_lb": float(rank_costs(ph, ph.origin).max(initial=0.0) / lb) if lb else 1.0,
                "sample_over_item_lb": float(o_sample.costs.max(initial=0.0) / lb) if lb else 1.0,
                "item_over_item_lb": float(o_item.costs.max(initial=0.0) / lb) if lb else 1.0,
                "cuts": o_item.cuts,
                "inter_frac_sample": o_sample.inter_node_bytes / total if total else 0.0,
                "inter_frac_item": o_item.inter_node_bytes / total if total else 0.0,
                "item_seconds": o_item.seconds,
                "all_phases_seconds": wall,
                "all_phases_cpu_seconds": cpu,
                "before_all_phases_cpu_seconds": before_cpu,
            }
        )  # fmt: skip
    return rows


def print_item_table(rows: list[dict]) -> None:
    head = (
        f"{'mix':<16} {'N x per':>9} {'phase':<6} {'items':>7} | {'none':>6} {'sample':>6} {'item':>6} {'cuts':>5} "
        f"| {'inter s':>7} {'inter i':>7} | {'ms':>6} {'all':>6} {'cpu':>6} {'before':>6}"
    )
    print("max cost / LB at item granularity (none, orch by sample, orch by item); inter-node bytes / phase bytes;")
    print("ms: the phase by item, all phases by item (wall, CPU), all phases by whole sample with --baseline (CPU)")
    print(head)
    print("-" * len(head))
    for r in rows:
        before = r["before_all_phases_cpu_seconds"]
        print(
            f"{r['mix']:<16} {str(r['ranks']) + 'x' + str(r['per_rank']):>9} {r['phase']:<6} {r['items']:>7} | "
            f"{r['none_over_item_lb']:>6.3f} {r['sample_over_item_lb']:>6.3f} {r['item_over_item_lb']:>6.3f} "
            f"{r['cuts']:>5} | {100 * r['inter_frac_sample']:>6.1f}% {100 * r['inter_frac_item']:>6.1f}% | "
            f"{1000 * r['item_seconds']:>6.1f} {1000 * r['all_phases_seconds']:>6.1f} "
            f"{1000 * r['all_phases_cpu_seconds']:>6.1f} {'-' if before is None else f'{1000 * before:.1f}':>6}"
        )


def _dest(ph: PhaseArrays, mode: str) -> np.ndarray:
    if mode == "kk":
        if ph.spec.padded:
            return dispatch_phase(ph, Mode.LPT)  # padded: the binary search is exact; no KK variant
        return karmarkar_karp(ph.costs, ph.num_ranks)
    return dispatch_phase(ph, Mode(mode))


def load_baseline(ref: str) -> Callable[[PhaseArrays, Mode], np.ndarray]:
    """dispatch_phase of planner/balance/ as git commit `ref` has it, imported beside today's (for a
    before/after in one run): its files copied to a temporary package, their imports of each other renamed."""
    root = Path(__file__).resolve().parents[1]
    files = subprocess.run(
        ["git", "-C", str(root), "ls-tree", "--name-only", f"{ref}:planner/balance"],
        check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    name = "orch_baseline_balance"
    pkg = Path(tempfile.mkdtemp(prefix="bench-balance-")) / name
    pkg.mkdir()
    for f in files:
        if f.endswith(".py"):
            text = subprocess.run(
                ["git", "-C", str(root), "show", f"{ref}:planner/balance/{f}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            (pkg / f).write_text(
                text.replace("orch.planner.balance.", f"{name}.").replace("orch.planner.balance", name)
            )
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module(f"{name}.dispatch").dispatch_phase  # type: ignore[no-any-return]


def run_case(
    mix: str, num_ranks: int, per_rank: int, repeat: int, skip_kk_above: int, modes: tuple[str, ...] = MODES,
    dispatch: Callable[[PhaseArrays, Mode], np.ndarray] = dispatch_phase,
) -> list[dict]:  # fmt: skip
    phases, origin = make_batch(mix, num_ranks, per_rank)
    rows = []
    orch_total = []
    orch_cpu = []
    for _ in range(repeat):
        start = time.perf_counter()
        cpu = time.process_time()
        outs = {name: dispatch(ph, Mode.ORCH) for name, ph in phases.items()}
        full = {}
        for name, ph in phases.items():
            d = origin.copy()
            d[ph.ids] = outs[name]
            full[name] = d
        if LLM_PHASE in full:  # the composed routes, as the runtime needs them
            _ = {k: np.stack([v, full[LLM_PHASE]], axis=1) for k, v in full.items() if k != LLM_PHASE}
        orch_total.append(time.perf_counter() - start)
        orch_cpu.append(time.process_time() - cpu)
    for name, ph in phases.items():
        lb = lower_bound(ph)
        total_bytes = int(ph.bytes.sum())
        row: dict = {"mix": mix, "ranks": num_ranks, "per_rank": per_rank, "phase": name, "samples": ph.n}
        for mode in MODES:
            if mode not in modes or (mode == "kk" and ph.n > skip_kk_above):
                row[mode] = None
                continue
            times = []
            reps = repeat if mode == "orch" else 1
            for _ in range(reps):
                start = time.perf_counter()
                dest = dispatch(ph, Mode.ORCH) if mode == "orch" else _dest(ph, mode)
                times.append(time.perf_counter() - start)
            costs = rank_costs(ph, dest)
            moved = moved_bytes(ph.origin, dest, ph.bytes, ph.dp_per_node)
            row[mode] = {
                "max_over_lb": float(costs.max() / lb) if lb > 0 else 1.0,
                "inter_frac": moved.inter / total_bytes if total_bytes else 0.0,
                "intra_frac": moved.intra / total_bytes if total_bytes else 0.0,
                "seconds": statistics.median(times),
            }
        rows.append(row)
    for row in rows:
        row["orch_all_phases_seconds"] = statistics.median(orch_total)
        row["orch_all_phases_cpu_seconds"] = statistics.median(orch_cpu)  # this process's CPU: robust to a busy machine
    return rows


def _fmt(v: dict | None, key: str, pct: bool = False) -> str:
    if v is None:
        return "-"
    x = v[key]
    if pct:
        return f"{100 * x:.1f}%"
    if key == "seconds":
        return f"{x * 1000:.1f}"
    return f"{x:.4f}"


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'mix':<14} {'N x per':>9} {'phase':<6} | {'none':>6} {'lpt':>6} {'kk':>6} {'paper':>6} {'orch':>6} "
        f"| {'lpt':>6} {'paper':>6} {'orch':>6} | {'lpt ms':>7} {'kk ms':>8} {'paper ms':>8} {'orch ms':>7} {'all':>6} {'cpu':>6}"
    )
    print(
        "max cost / LB (none lpt kk paper orch) | inter-node bytes / phase bytes (lpt paper orch) "
        "| ms (all: all phases of orch, wall and CPU)"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        size = f"{r['ranks']}x{r['per_rank']}"
        print(
            f"{r['mix']:<14} {size:>9} {r['phase']:<6} | "
            + " ".join(f"{_fmt(r[m], 'max_over_lb'):>6}" for m in MODES)
            + " | "
            + " ".join(f"{_fmt(r[m], 'inter_frac', pct=True):>6}" for m in ("lpt", "paper", "orch"))
            + " | "
            + f"{_fmt(r['lpt'], 'seconds'):>7} {_fmt(r['kk'], 'seconds'):>8} {_fmt(r['paper'], 'seconds'):>8} "
            + f"{_fmt(r['orch'], 'seconds'):>7} {r['orch_all_phases_seconds'] * 1000:>6.1f}"
            + f" {r['orch_all_phases_cpu_seconds'] * 1000:>6.1f}"
        )


def print_comparison(before: list[dict], after: list[dict]) -> None:
    """Per mix, size and phase: orch's max / LB, inter-node bytes and ms before and after; all phases' CPU ms."""
    head = (
        f"{'mix':<14} {'N x per':>9} {'phase':<6} | {'max/LB':>7} {'->':>7} | {'inter':>6} {'->':>6} "
        f"| {'ms':>6} {'->':>6} | {'all cpu ms':>10} {'->':>6} {'ratio':>6}"
    )
    print("orch before -> after (same batches, same run)")
    print(head)
    print("-" * len(head))
    for b, a in zip(before, after, strict=True):
        if b["orch"] is None or a["orch"] is None:
            continue
        ob, oa = b["orch"], a["orch"]
        cb, ca = b["orch_all_phases_cpu_seconds"], a["orch_all_phases_cpu_seconds"]
        print(
            f"{a['mix']:<14} {str(a['ranks']) + 'x' + str(a['per_rank']):>9} {a['phase']:<6} | "
            f"{ob['max_over_lb']:>7.4f} {oa['max_over_lb']:>7.4f} | "
            f"{100 * ob['inter_frac']:>5.1f}% {100 * oa['inter_frac']:>5.1f}% | "
            f"{1000 * ob['seconds']:>6.1f} {1000 * oa['seconds']:>6.1f} | "
            f"{1000 * cb:>10.1f} {1000 * ca:>6.1f} {cb / ca if ca else 1.0:>6.2f}"
        )


def summarise(rows: list[dict]) -> dict:
    quality = []
    ratios = []
    for r in rows:
        refs = [r[m]["max_over_lb"] for m in ("lpt", "kk") if r[m] is not None]
        if refs:
            quality.append(r["orch"]["max_over_lb"] / min(refs))
        if r["paper"] is not None and r["paper"]["inter_frac"] > 0:
            ratios.append(r["orch"]["inter_frac"] / r["paper"]["inter_frac"])
    big = {r["mix"]: r for r in rows if r["ranks"] == 2560 and r["per_rank"] == 16}
    worst = max(
        (r for r in rows if r["paper"] is not None and r["paper"]["inter_frac"] > 0),
        key=lambda r: r["orch"]["inter_frac"] / r["paper"]["inter_frac"],
        default=None,
    )
    out: dict = {
        "orch_max_over_best_of_lpt_kk_worst": max(quality) if quality else None,
        "orch_inter_over_paper_median": statistics.median(ratios) if ratios else 0.0,
        "orch_inter_over_paper_worst": max(ratios) if ratios else 0.0,
        "orch_inter_over_paper_worst_case": (
            f"{worst['mix']} {worst['ranks']}x{worst['per_rank']} {worst['phase']}" if worst else None
        ),
        "kk_compared_cases": sum(r["kk"] is not None for r in rows),
        "kk_skipped_cases": sum(r["kk"] is None for r in rows),
    }
    for mix, r in big.items():
        out[f"orch_all_phases_2560x16_seconds[{mix}]"] = r["orch_all_phases_seconds"]
        out[f"orch_all_phases_2560x16_cpu_seconds[{mix}]"] = r["orch_all_phases_cpu_seconds"]
    return out


def _size(text: str) -> tuple[int, int]:
    ranks, _, per = text.lower().partition("x")
    try:
        return int(ranks), int(per)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANKSxPER such as 2560x16, got {text!r}") from None


def main_items(args: argparse.Namespace) -> None:
    before = load_baseline(args.baseline) if args.baseline else None
    rows = []
    for mix in args.mix or list(ITEM_MIXES):
        for num_ranks, per_rank in args.size or [(64, 16), (2560, 16)]:
            rows.extend(run_item_case(mix, num_ranks, per_rank, args.repeat, before))
            print(f"done {mix} {num_ranks}x{per_rank}", file=sys.stderr, flush=True)
    print_item_table(rows)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"rows": rows, "baseline": args.baseline}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--repeat", type=int, default=5, help="runs of orch per case (median)")
    parser.add_argument("--mix", action="append", choices=sorted({*MIXES, *ITEM_MIXES}), help="only these mixes")
    parser.add_argument("--skip-kk-above", type=int, default=50_000, help="skip KK for phases with more samples")
    parser.add_argument("--size", action="append", type=_size, help="only these sizes, RANKSxPER (e.g. 2560x16)")
    parser.add_argument("--only-orch", action="store_true", help="leave out the reference modes (quick)")
    parser.add_argument("--baseline", default=None, help="git ref: its dispatcher measured too, same run")
    parser.add_argument("--out", default=None, help="JSON written here (default bench/out/bench_balance.json)")
    parser.add_argument(
        "--items", action="store_true", help="the mixes whose samples list items: by sample vs by item (ITEM_MIXES)"
    )
    args = parser.parse_args()
    if args.items:
        main_items(args)
        return
    sizes = args.size or (QUICK_SIZES if args.quick else SIZES)
    modes = ("orch",) if args.only_orch else MODES
    if args.out is None and not args.size and not args.only_orch:
        args.out = str(Path(__file__).parent / "out" / "bench_balance.json")
    baseline = load_baseline(args.baseline) if args.baseline else None
    rows, before = [], []
    for mix in args.mix or list(MIXES):
        for num_ranks, per_rank in sizes:
            if baseline is not None:  # the same batch, the same process, just before today's code
                before.extend(run_case(mix, num_ranks, per_rank, args.repeat, args.skip_kk_above, modes, baseline))
            case = run_case(mix, num_ranks, per_rank, args.repeat, args.skip_kk_above, modes)
            rows.extend(case)
            print(f"done {mix} {num_ranks}x{per_rank}", file=sys.stderr, flush=True)
    if before:
        print(f"before ({args.baseline}):")
        print_table(before)
        print("\nafter (this tree):")
    print_table(rows)
    summary = summarise(rows)
    if before:
        print()
        print_comparison(before, rows)
    print()
    for k, v in summary.items():
        print(f"{k}: {round(v, 4) if isinstance(v, float) else v}")
    if args.out is None:
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict = {"rows": rows, "summary": summary}
    if before:
        doc["baseline"] = {"ref": args.baseline, "rows": before, "summary": summarise(before)}
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
