"""`orch report RUN_DIR`: plots of a run's loss, step time per phase and per-rank imbalance (runtime/report.py)."""

from __future__ import annotations

import typer

from orch.cli.output import console


def report(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="A run's --workdir (holds metrics.jsonl)."),
    out: str | None = typer.Option(None, "--out", "-o", help="Where to write the PNGs (default: RUN_DIR/report)."),
) -> None:
    """Write PNG plots of the run's loss, step time per phase and per-rank imbalance over steps."""
    from pathlib import Path

    from orch.runtime.report import write_report
    from orch.runtime.workdir.metrics import metrics_path, read_metrics

    records = read_metrics(metrics_path(run_dir))
    folder = Path(out) if out else Path(run_dir) / "report"
    written = write_report(records, folder)
    c = console()
    c.print(f"{len(records)} steps: loss {records[0].loss:.4g} (step {records[0].step}) to {records[-1].loss:.4g} "
            f"(step {records[-1].step})")  # fmt: skip
    for path in written:
        c.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command()(report)
