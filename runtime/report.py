"""`orch report RUN_DIR`: PNG plots of a run's metrics (people look at curves, not JSON).

* loss.png: the global loss per step (and the learning rate on a second axis when recorded);
* phases.png: per step, the slowest rank's seconds in each of the largest phases, and the step;
* imbalance.png: per step and post-balanced phase, the slowest rank's cost over the mean rank's, before
  and after the dispatcher (1.0: every rank equally busy).

Matplotlib draws off-screen (Agg); each file is written to a temporary name and renamed (never half).
"""

from __future__ import annotations

import os
from pathlib import Path

from orch.runtime.workdir.metrics import StepRecord, phase_imbalance

TOP_PHASES = 6


def _save(fig: object, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    os.replace(tmp, path)


def write_report(records: list[StepRecord], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    steps = [r.step for r in records]
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r.loss for r in records], color="tab:blue", label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log" if min(r.loss for r in records) > 0 else "linear")
    if any(r.lr for r in records):
        lr = ax.twinx()
        lr.plot(steps, [r.lr or 0.0 for r in records], color="tab:gray", linestyle="--", label="lr")
        lr.set_ylabel("learning rate")
    ax.set_title(f"loss: {records[0].loss:.4g} at step {steps[0]}, {records[-1].loss:.4g} at step {steps[-1]}")
    _save(fig, out / "loss.png")
    written.append(out / "loss.png")
    plt.close(fig)

    totals: dict[str, float] = {}
    for r in records:
        for phase in {k for ranks in r.ranks.values() for k in ranks if k != "step"}:
            totals[phase] = totals.get(phase, 0.0) + max(v.get(phase, 0.0) for v in r.ranks.values())
    top = sorted(totals, key=lambda p: -totals[p])[:TOP_PHASES]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r.step_time_s for r in records], color="black", label="step")
    for phase in top:
        ax.plot(steps, [max(v.get(phase, 0.0) for v in r.ranks.values()) for r in records], label=phase)
    ax.set_xlabel("step")
    ax.set_ylabel("seconds (slowest rank)")
    ax.set_title("step time and its largest phases")
    ax.legend(fontsize=8)
    _save(fig, out / "phases.png")
    written.append(out / "phases.png")
    plt.close(fig)

    phases = sorted({p for r in records for p, v in r.balance.items() if isinstance(v, dict) and "max_cost" in v})
    fig, ax = plt.subplots(figsize=(7, 4))
    for phase in phases:
        for key, style in (("", "-"), ("_before", ":")):
            ys = [phase_imbalance(r, before=bool(key)).get(phase, 1.0) for r in records]
            ax.plot(steps, ys, linestyle=style, label=f"{phase} {'after' if not key else 'before'}")
    ax.axhline(1.0, color="gray", linewidth=0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("slowest rank / mean rank")
    ax.set_title(f"per-rank imbalance ({records[0].balance.get('mode', 'none')} post-balancing)")
    if phases:
        ax.legend(fontsize=8)
    _save(fig, out / "imbalance.png")
    written.append(out / "imbalance.png")
    plt.close(fig)
    return written
