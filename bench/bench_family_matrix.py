"""The family matrix in full: every row of tests/family_matrix.py (each multimodal family the registry lists, and
LLaVA with other towers and LLMs) under every plan kind, each cell held in float64 against the HF model's own
step 0 as tests/distributed/test_family_matrix.py holds the cells `make test` runs: the loss over the whole batch
(relative error) and every parameter's gradient (error over the tensor's largest entry, tests/equivalence.py
`gradient_errors`). A cell the family's modules refuse is "n/a" with the reason (`ModuleSpec.refuses`).

Prints the table (rows: families; columns: plan kinds; cells: loss error / gradient error), writes
bench/out/family_matrix.json, and exits 1 if any cell exceeds 1e-9 or fails to run. A row's cells of one
world size run in one launch; if that launch fails, its cells run one by one so the failing ones are named.

    python bench/bench_family_matrix.py [--rows ROW,...] [--kinds KIND,...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from equivalence import gradient_errors, renamed_gradients  # noqa: E402
from family_matrix import PLAN_KINDS, ROWS, build_row, cell_name, run_cells  # noqa: E402

TOLERANCE = 1e-9
OUT = ROOT / "bench" / "out" / "family_matrix.json"


def measure(records: dict, folder: Path, name: str, want: tuple) -> dict:
    """One cell's errors against HF: its loss's relative error, the worst gradient's, and which parameter."""
    keys, want_loss, want_grads = want
    loss = records[name][0].loss
    got = renamed_gradients(folder, name, keys)
    if set(got) != set(want_grads):
        return {"status": "error", "why": f"parameters differ from HF's: {sorted(set(got) ^ set(want_grads))[:4]}"}
    errors = {k: err / scale for k, (err, scale) in gradient_errors(got, want_grads).items()}
    worst = max(errors, key=errors.__getitem__)
    loss_err = abs(loss - want_loss) / abs(want_loss)
    ok = loss_err <= TOLERANCE and errors[worst] <= TOLERANCE
    return {"status": "ok" if ok else "exceeds", "loss": loss, "hf_loss": want_loss, "loss_rel_error": loss_err,
            "grad_error": errors[worst], "worst_parameter": worst}  # fmt: skip


def attempt(cells: list[tuple[str, str]], built: dict, out: Path) -> dict[str, dict]:
    """`cells` (of one world size) in one launch; if it fails, each cell in a launch of its own, so that the
    failing ones are named with their error."""
    try:
        records, folders = run_cells(cells, built, out)
    except Exception as exc:  # one cell's failure fails its whole launch
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        if len(cells) == 1:
            return {cell_name(*cells[0]): {"status": "error", "why": why}}
        print(f"a launch of {len(cells)} cells failed ({why}); running them one by one", flush=True)
        return {k: v for i, cell in enumerate(cells) for k, v in attempt([cell], built, out / str(i)).items()}
    return {
        cell_name(r, k): measure(records, folders[cell_name(r, k)], cell_name(r, k), built[r].want) for r, k in cells
    }


def run(cells: list[tuple[str, str]], built: dict, out: Path) -> dict[str, dict]:
    """Every cell's result: one launch per row and world size (a failing cell costs its row a rerun, not the
    matrix)."""
    groups: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for row, kind in cells:
        groups.setdefault((row, PLAN_KINDS[kind].world_size), []).append((row, kind))
    results = {}
    for (row, world), group in groups.items():
        start = time.monotonic()
        results |= attempt(group, built, out / f"{row}-{world}")
        print(f"{row}, {world} ranks: {len(group)} cells in {time.monotonic() - start:.0f} s", flush=True)
    return results


def cell_text(result: dict, footnotes: list[str]) -> str:
    if result["status"] == "n/a":
        footnotes.append(result["why"])
        return f"n/a: {result['why'].split(':')[0]} [{len(footnotes)}]"
    if result["status"] == "error":
        footnotes.append(result["why"])
        return f"ERROR [{len(footnotes)}]"
    mark = "" if result["status"] == "ok" else " !"
    return f"{result['loss_rel_error']:.1e} / {result['grad_error']:.1e}{mark}"


def table(rows: list[str], kinds: list[str], results: dict[str, dict]) -> str:
    footnotes: list[str] = []
    cells = [[cell_text(results[cell_name(r, k)], footnotes) for k in kinds] for r in rows]
    head = ["family", *kinds]
    body = [[r, *c] for r, c in zip(rows, cells, strict=True)]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    legend = [
        f"cells: loss relative error / largest gradient error (of the tensor's largest entry); ! over {TOLERANCE:g}"
    ]
    legend += [f"{k}: {PLAN_KINDS[k].title}" for k in kinds]
    legend += [f"[{i}] {why}" for i, why in enumerate(footnotes, 1)]
    return "\n".join([*lines, "", *legend])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="rows of tests/family_matrix.py (default: all)")
    parser.add_argument("--kinds", default=",".join(PLAN_KINDS), help="plan kinds (default: all)")
    args = parser.parse_args()
    rows, kinds = args.rows.split(","), args.kinds.split(",")
    unknown = [r for r in rows if r not in ROWS] + [k for k in kinds if k not in PLAN_KINDS]
    if unknown:
        print(f"error: --rows/--kinds: unknown {', '.join(unknown)}; rows: {', '.join(ROWS)}; kinds: "
              f"{', '.join(PLAN_KINDS)}", file=sys.stderr)  # fmt: skip
        return 2
    start = time.monotonic()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="family-matrix-") as tmp:
        built = {}
        for r in rows:
            if ROWS[r].missing:
                results |= {cell_name(r, k): {"status": "error", "why": ROWS[r].missing} for k in kinds}
            else:
                built[r] = build_row(ROWS[r], Path(tmp) / "models")
        cells = []
        for r in built:
            for k in kinds:
                why = PLAN_KINDS[k].refusal(built[r].model)
                if why:
                    results[cell_name(r, k)] = {"status": "n/a", "why": why}
                else:
                    cells.append((r, k))
        print(f"{len(cells)} cells to run, {len(results)} n/a", flush=True)
        results |= run(cells, built, Path(tmp) / "runs")
    print(table(rows, kinds, results))
    bad = sorted(n for n, res in results.items() if res["status"] in ("exceeds", "error"))
    print(f"\n{len(results)} cells in {time.monotonic() - start:.0f} s; over {TOLERANCE:g} or failed: {bad or 'none'}")
    from orch.planner.io import write_text_atomic

    OUT.parent.mkdir(parents=True, exist_ok=True)
    report = {"tolerance": TOLERANCE, "rows": rows, "plan_kinds": {k: PLAN_KINDS[k].title for k in kinds},
              "cells": {r: {k: results[cell_name(r, k)] for k in kinds} for r in rows}}  # fmt: skip
    write_text_atomic(OUT, json.dumps(report, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
