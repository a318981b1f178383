"""Benchmark of the batch post-balancing dispatcher (issue 3): none / lpt / kk / paper / orch.

Generates realistic multimodal global batches (text-only, image, video, ASR and audio-visual
samples with log-normal long tails; and a capped mix where the mean rather than one giant sample
sets the bound), balances every phase with each mode, and prints per mix, size and phase:
max cost ÷ lower bound, inter-node bytes ÷ all bytes of the phase, and seconds (median of
--repeat runs for orch; one run for the slow references). Writes bench/out/bench_balance.json.

    .venv/bin/python bench/bench_balance.py            # the full table (several minutes: KK is slow)
    .venv/bin/python bench/bench_balance.py --quick    # small sizes only
    .venv/bin/python bench/bench_balance.py --size 2560x16 --only-orch --repeat 7   # the 50 ms check, seconds

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
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orch.planner.balance.batch import LLM_PHASE, PhaseSpec
from orch.planner.balance.cost import PhaseArrays, build_phase_arrays, lower_bound, moved_bytes, rank_costs
from orch.planner.balance.dispatch import dispatch_phase
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
    tokens: dict[str, tuple[int, int]]  # phase -> (mean, cap)
    sigma: float = 0.7


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
}

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
            if name not in task.tokens:
                continue
            mean, cap = task.tokens[name]
            sel = np.flatnonzero(kind == k)
            draw = mean * np.exp(rng.normal(-(task.sigma**2) / 2, task.sigma, size=sel.size))
            lengths[sel] = np.clip(np.rint(draw), 1, cap).astype(np.int64)
        bytes_ = lengths * BYTES_PER_TOKEN[name]
        phases[name] = build_phase_arrays(name, spec, lengths, origin, bytes_, num_ranks, dp_per_node)
    return phases, origin


def _dest(ph: PhaseArrays, mode: str) -> np.ndarray:
    if mode == "kk":
        if ph.spec.padded:
            return dispatch_phase(ph, Mode.LPT)  # padded: the binary search is exact; no KK variant
        return karmarkar_karp(ph.costs, ph.num_ranks)
    return dispatch_phase(ph, Mode(mode))


def run_case(
    mix: str, num_ranks: int, per_rank: int, repeat: int, skip_kk_above: int, modes: tuple[str, ...] = MODES
) -> list[dict]:
    phases, origin = make_batch(mix, num_ranks, per_rank)
    rows = []
    orch_total = []
    orch_cpu = []
    for _ in range(repeat):
        start = time.perf_counter()
        cpu = time.process_time()
        outs = {name: dispatch_phase(ph, Mode.ORCH) for name, ph in phases.items()}
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
                dest = _dest(ph, mode)
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
        f"{'mix':<13} {'N x per':>9} {'phase':<6} | {'none':>6} {'lpt':>6} {'kk':>6} {'paper':>6} {'orch':>6} "
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
            f"{r['mix']:<13} {size:>9} {r['phase']:<6} | "
            + " ".join(f"{_fmt(r[m], 'max_over_lb'):>6}" for m in MODES)
            + " | "
            + " ".join(f"{_fmt(r[m], 'inter_frac', pct=True):>6}" for m in ("lpt", "paper", "orch"))
            + " | "
            + f"{_fmt(r['lpt'], 'seconds'):>7} {_fmt(r['kk'], 'seconds'):>8} {_fmt(r['paper'], 'seconds'):>8} "
            + f"{_fmt(r['orch'], 'seconds'):>7} {r['orch_all_phases_seconds'] * 1000:>6.1f}"
            + f" {r['orch_all_phases_cpu_seconds'] * 1000:>6.1f}"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--repeat", type=int, default=5, help="runs of orch per case (median)")
    parser.add_argument("--mix", action="append", choices=sorted(MIXES), help="only these mixes")
    parser.add_argument("--skip-kk-above", type=int, default=50_000, help="skip KK for phases with more samples")
    parser.add_argument("--size", action="append", type=_size, help="only these sizes, RANKSxPER (e.g. 2560x16)")
    parser.add_argument("--only-orch", action="store_true", help="leave out the reference modes (quick)")
    parser.add_argument("--out", default=None, help="JSON written here (default bench/out/bench_balance.json)")
    args = parser.parse_args()
    sizes = args.size or (QUICK_SIZES if args.quick else SIZES)
    modes = ("orch",) if args.only_orch else MODES
    if args.out is None and not args.size and not args.only_orch:
        args.out = str(Path(__file__).parent / "out" / "bench_balance.json")
    rows = []
    for mix in args.mix or list(MIXES):
        for num_ranks, per_rank in sizes:
            case = run_case(mix, num_ranks, per_rank, args.repeat, args.skip_kk_above, modes)
            rows.extend(case)
            print(f"done {mix} {num_ranks}x{per_rank}", file=sys.stderr, flush=True)
    print_table(rows)
    summary = summarise(rows)
    print()
    for k, v in summary.items():
        print(f"{k}: {round(v, 4) if isinstance(v, float) else v}")
    if args.out is None:
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
