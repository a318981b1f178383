"""Planner scaling: `make_plan` time against cluster size (8 to 100,000 GPUs) and module count (1 to 4 encoders).

Each cell plans an omni-style model (the omni-84b LLM; encoders alternating its ViT and Whisper-like
towers) on h100-80g nodes, on the model's default mix (one task per encoder and a text task) with a global
batch that grows with the cluster (2 samples per GPU, at least 1,024), under the CLI's solver settings
(one CP-SAT worker, 4 alternatives): the median of --repeats runs in one process, after one untimed
warm-up (imports, ortools). Prints a table and writes bench/out/plan_scaling.json.

Growth, measured (issue 33; 2-core machine, quiet, median of 3, CPU seconds, 2026-12-04): the cost is the
candidates (every layout of every module on every island size the search considers; IslandSizes keeps every
size up to 40 a side, then a grid of sizes some layout fills exactly, growing by octaves) and one CP-SAT model
per placement over the pruned candidates. Candidates grow about as log(GPUs) (347 -> 1,333 from 64 to 100,000
GPUs, one encoder; 521 -> 2,077 with four); plan time grows as about GPUs^0.4-0.5 (x19-x37 from 64 to 100,000
GPUs), well below linear. Per added encoder it grows 1.2-1.4x while colocated plans win (<= 2,560 GPUs: 0.56
-> 1.10 s from one encoder to four) and more where disaggregation wins (>= 10,240 GPUs: the model's island
groups are the 2^e - 1 subsets of the encoders, each with its enforced pace bounds): 100,000 GPUs take 1.97 /
3.35 / 7.78 / 6.75 s with 1 / 2 / 3 / 4 encoders. Two solver settings keep the disaggregated model's solves
short: CP-SAT without its LP relaxation (SolverConfig.linearization_level 0: four encoders on 2,560 GPUs
2.62 -> 1.18 s, two on 100,000 8.0 -> 3.35 s; with it the solve time swung 0.26-1.74 s with the seed), and
runner-ups given the first solve's time each (search.RUNNER_UP_MIN_S; four encoders on 100,000 GPUs took 26 s
when each was proven optimal); the homogeneous baseline picks its encoders' options from their Pareto
front (candidates._encoder_front: 1.18 -> 1.10 s). 8 GPUs do not hold the 84B LLM: the planner says so in 0.01-0.04 s.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from orch.planner.candidates import SearchInput
from orch.planner.errors import OrchError
from orch.planner.loading import default_mix, load_cluster
from orch.planner.planner import make_plan
from orch.planner.search import SolverConfig, build_candidates
from orch.planner.specs import ModelSpec
from orch.runtime.models.registry import load_model

GPUS = (8, 64, 512, 2560, 10240, 100000)
ENCODERS = (1, 2, 3, 4)


def model_with(encoders: int) -> ModelSpec:
    """omni-84b's LLM with `encoders` towers: vision, audio, then more of each (vision2, audio2)."""
    omni = load_model("omni-84b")
    towers = [omni.modules["vision"], omni.modules["audio"]]
    names = ["vision", "audio", "vision2", "audio2"]
    modules = {names[i]: towers[i % 2] for i in range(encoders)}
    return ModelSpec(name=f"omni-{encoders}enc", modules={**modules, "llm": omni.modules["llm"]})


def cell(gpus: int, encoders: int, repeats: int) -> dict:
    model = model_with(encoders)
    data = default_mix(model)
    data = data.model_copy(update={"global_batch": max(1024, 2 * gpus)})
    inp = SearchInput(model, load_cluster("h100-80g", gpus // 8), data)
    solver = SolverConfig(time_limit_s=10.0, workers=1, alternatives=4)
    times, cpus, error, plan = [], [], None, None
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        try:
            plan = make_plan(inp, solver)
        except OrchError as exc:
            error = str(exc)
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    row = {
        "gpus": gpus,
        "encoders": encoders,
        "global_batch": data.global_batch,
        "candidates": build_candidates(inp).size(),
        "plan_s": round(statistics.median(times), 3),
        "plan_s_all": [round(t, 3) for t in times],
        "cpu_s": round(statistics.median(cpus), 3),  # this process's CPU (CP-SAT's one worker included)
    }
    if plan is not None:
        row |= {"placement": plan.placement.value, "step_s": round(plan.predicted.step_time_s, 4)}
    else:
        row |= {"placement": "-", "error": error}
    return row


def print_table(rows: list[dict], repeats: int) -> None:
    gpus = sorted({r["gpus"] for r in rows})
    encoders = sorted({r["encoders"] for r in rows})
    by = {(r["gpus"], r["encoders"]): r for r in rows}
    print(
        f"\nmake_plan wall s / CPU s, median of {repeats} (candidates; placement: c=colocated d=disaggregated "
        "h=homogeneous, -: the model does not fit)"
    )
    print(f"{'GPUs':>7} {'batch':>7} " + " ".join(f"{f'{e} enc':>24}" for e in encoders))
    for g in gpus:
        cells = []
        for e in encoders:
            r = by[(g, e)]
            cells.append(f"{r['plan_s']:6.2f}/{r['cpu_s']:5.2f} ({r['candidates']:4d}) {r['placement'][:1]}")
        print(f"{g:>7} {by[(g, encoders[0])]['global_batch']:>7} " + " ".join(f"{c:>24}" for c in cells))
    # growth: per 10x GPUs (64 -> 100,000, log-log slope) and per added encoder (at each size)
    for e in encoders:
        a, b = by.get((64, e)), by.get((100000, e))
        if a and b and a["cpu_s"] > 0:
            slope = math.log(b["cpu_s"] / a["cpu_s"]) / math.log(100000 / 64)
            print(f"  {e} enc: CPU x{b['cpu_s'] / a['cpu_s']:.0f} from 64 to 100,000 GPUs (~GPUs^{slope:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpus", type=int, nargs="*", default=list(GPUS))
    parser.add_argument("--encoders", type=int, nargs="*", default=list(ENCODERS))
    parser.add_argument("--table", help="print the table of a JSON this bench wrote, and exit")
    args = parser.parse_args()
    if args.table:
        print_table(json.loads(Path(args.table).read_text()), args.repeats)
        return
    cell(8, 1, 1)  # warm-up: imports, ortools
    rows = []
    for e in args.encoders:
        for g in args.gpus:
            rows.append(cell(g, e, args.repeats))
            r = rows[-1]
            print(f"  {e} enc {g:>6} GPUs: {r['plan_s']:.2f} s ({r['cpu_s']:.2f} s CPU) {r['placement']}", flush=True)
    print_table(rows, args.repeats)
    out = Path(__file__).parent / "out" / "plan_scaling.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
