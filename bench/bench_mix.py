"""A mix's sampled counts against its weights (runtime/data/mix.py): per strategy, the draws of each source over
10,000 samples (steps of --global-batch) against what the shares expect, and Pearson's chi-square statistic.

    .venv/bin/python bench/bench_mix.py [--draws 10000] [--global-batch 250] [--seed 0]
                                          (prints a table, writes bench/out/bench_mix.json)

The mix: three sources of 6, 1 and 200 rows (LLaMA-Factory's `mllm_demo.json` beside a 1-row file and a larger
one) with weights 1, 1 and 2, and a fourth whose every row was rejected (weight 1: it takes no share). The
chi-square's degrees of freedom are the live sources less one (2 here: 5.99 at p = 0.05, 9.21 at p = 0.01).
Also: the distinct rows of each source drawn (every row is reached), and the largest count of one row of a source
before every row of it was drawn (1 without replacement).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from orch.runtime.data.mix import STRATEGIES, Mix

SIZES = (6, 1, 200, 0)
WEIGHTS = (1.0, 1.0, 2.0, 1.0)


def measure(mix: Mix, seed: int, draws: int, batch: int) -> dict[str, object]:
    steps = -(-draws // batch)
    rows = [r for k in range(steps) for r in mix.rows(seed, k, batch)][:draws]
    offsets = [sum(mix.sizes[:s]) for s in range(len(mix.sizes))]
    source_of = [s for s, n in enumerate(mix.sizes) for _ in range(n)]
    counts = Counter(source_of[r] for r in rows)
    shares = mix.shares()
    expected = [p * draws for p in shares]
    chi2 = sum((counts[s] - e) ** 2 / e for s, e in enumerate(expected) if e > 0)
    repeats = []  # per source: the most draws of one row among the source's first n draws
    for s, n in enumerate(mix.sizes):
        first = [r - offsets[s] for r in rows if source_of[r] == s][:n]
        repeats.append(max(Counter(first).values()) if first else 0)
    return {
        "strategy": mix.strategy,
        "replacement": mix.replacement,
        "observed": [counts[s] for s in range(len(mix.sizes))],
        "expected": expected,
        "shares": shares,
        "chi2": chi2,
        "dof": sum(1 for p in shares if p > 0) - 1,
        "distinct_rows": [len({r for r in rows if source_of[r] == s}) for s in range(len(mix.sizes))],
        "most_draws_of_a_row_in_first_pass": repeats,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=10_000)
    ap.add_argument("--global-batch", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "bench_mix.json"))
    args = ap.parse_args()
    results = []
    for strategy in STRATEGIES:
        for replacement in (False, True):
            mix = Mix(SIZES, WEIGHTS, strategy, replacement)
            results.append(measure(mix, args.seed, args.draws, args.global_batch))
    print(
        f"mix of {SIZES} rows, weights {WEIGHTS}; {args.draws} draws in steps of {args.global_batch}, seed {args.seed}"
    )
    head = f"{'strategy':<17} {'repl':<5} {'source':>6} {'rows':>5} {'share':>7} {'expected':>9} {'observed':>9} {'distinct':>8}"
    print(head)
    print("-" * len(head))
    for r in results:
        for s, n in enumerate(SIZES):
            print(f"{r['strategy']:<17} {r['replacement']!s:<5} {s:>6} {n:>5} {r['shares'][s]:>7.3f} "
                  f"{r['expected'][s]:>9.1f} {r['observed'][s]:>9} {r['distinct_rows'][s]:>8}")  # fmt: skip
        print(f"{'':<17} chi-square {r['chi2']:.3f} on {r['dof']} degrees of freedom; most draws of one row "
              f"before its source's pass ends: {r['most_draws_of_a_row_in_first_pass']}")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"sizes": SIZES, "weights": WEIGHTS, "draws": args.draws,
                               "global_batch": args.global_batch, "seed": args.seed, "results": results}, indent=1))  # fmt: skip
    print(f"written to {out}")


if __name__ == "__main__":
    main()
