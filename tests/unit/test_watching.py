"""Watching a run: the progress line, the scalars `--report-to` logs, and what a missing backend says."""

import io

import pytest
from rich.console import Console

from orch.cli.progress import StepProgress
from orch.planner.errors import SpecError
from orch.runtime.progress import progress_line
from orch.runtime.reporting import check_installed, step_scalars
from orch.runtime.workdir.metrics import StepRecord, phase_imbalance


def _record(step, loss=2.5, tokens=1200, step_time_s=0.5):
    return StepRecord(
        step=step, loss=loss, tokens=tokens, step_time_s=step_time_s, lr=1e-4, grad_norm=0.75,
        ranks={"0": {"llm.fwd_bwd": 0.25, "grad_sync": 0.05, "step": 0.5}, "1": {"llm.fwd_bwd": 0.3, "step": 0.45}},
        balance={"mode": "orch", "llm": {"max_cost": 3.0, "mean_cost": 2.0, "max_cost_before": 5.0, "mean_cost_before": 2.0}},
        memory={"0": {"state_bytes": 2**30, "peak_bytes": 3 * 2**30}, "1": {"state_bytes": 2**29, "peak_bytes": 2**31}},
    )  # fmt: skip


def test_the_progress_line_has_step_total_loss_rate_and_eta():
    assert progress_line(_record(2), 10, [0.5, 0.5]) == "step 3/10  loss 2.500000  2.4k tok/s  ETA 0:00:04"
    assert progress_line(_record(9), 10, [0.5]) == "step 10/10  loss 2.500000  2.4k tok/s  ETA 0:00:00"
    slow = _record(0, tokens=100, step_time_s=4000.0)
    assert progress_line(slow, 3, [4000.0]) == "step 1/3  loss 2.500000  0 tok/s  ETA 2:13:20"


def test_off_a_terminal_each_new_step_is_a_plain_line_and_a_torn_line_waits(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_record(0).model_dump_json() + "\n")  # a resumed run's earlier step: not shown again
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with StepProgress(console, path, 3) as progress:
        line = _record(1).model_dump_json()
        with open(path, "a") as f:
            f.write(line[:40])  # rank 0 mid-write
        progress.poll()
        assert out.getvalue() == ""
        with open(path, "a") as f:
            f.write(line[40:] + "\n" + _record(2).model_dump_json() + "\n")
        progress.poll()
    assert out.getvalue().splitlines() == [
        "step 2/3  loss 2.500000  2.4k tok/s  ETA 0:00:01",
        "step 3/3  loss 2.500000  2.4k tok/s  ETA 0:00:00",
    ]


def test_the_reported_scalars_are_the_record_numbers():
    scalars = step_scalars(_record(4))
    assert scalars == {
        "train/loss": 2.5, "train/tokens": 1200.0, "train/tokens_per_s": 2400.0, "train/lr": 1e-4,
        "train/grad_norm": 0.75, "time/step_s": 0.5, "time/llm.fwd_bwd": 0.3, "time/grad_sync": 0.05,
        "imbalance/llm": 1.5, "memory/peak_gib": 3.0, "memory/state_gib": 1.0,
    }  # fmt: skip
    assert phase_imbalance(_record(4), before=True) == {"llm": 2.5}


def test_a_missing_backend_names_what_to_install(monkeypatch):
    import orch.runtime.reporting as reporting

    monkeypatch.setattr(reporting.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpecError) as info:
        check_installed(["mlflow"])
    assert (
        str(info.value)
        == "--report-to: mlflow is not installed: pip install mlflow-skinny (or pip install 'orch[report]')"
    )


def test_on_a_terminal_the_line_is_redrawn_in_place(tmp_path):
    path = tmp_path / "metrics.jsonl"
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with StepProgress(console, path, 3) as progress:
        path.write_text("".join(_record(k).model_dump_json() + "\n" for k in range(3)))
        progress.poll()
    text = out.getvalue()
    assert "step 3/3  loss 2.500000  2.4k tok/s  ETA 0:00:00" in text
    assert "\x1b[" in text  # cursor control: one line redrawn, not a line per step
    assert text.count("\n") <= 2
