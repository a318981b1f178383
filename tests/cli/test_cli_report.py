"""`orch report RUN_DIR`: the loss, phase and imbalance plots of a run, as PNG files."""

from orch.runtime.workdir.metrics import StepRecord, append_record, metrics_path


def _records(workdir, steps=5):
    for k in range(steps):
        ranks = {str(r): {"llm.fwd_bwd": 0.1 + 0.01 * r, "vision.fwd": 0.02, "step": 0.15} for r in range(2)}
        balance = {"mode": "orch", "vision": {"max_cost": 1.1, "mean_cost": 1.0, "max_cost_before": 2.0,
                                              "mean_cost_before": 1.0}}  # fmt: skip
        append_record(metrics_path(workdir), StepRecord(step=k, loss=5.0 / (k + 1), tokens=10, step_time_s=0.15,
                                                        ranks=ranks, balance=balance, lr=1e-3))  # fmt: skip


def test_report_writes_the_three_plots(cli, tmp_path):
    _records(tmp_path)
    r = cli("report", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "5 steps: loss 5 (step 0) to 1 (step 4)" in r.output
    for name in ("loss.png", "phases.png", "imbalance.png"):
        data = (tmp_path / "report" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    assert not list((tmp_path / "report").glob("*.tmp"))


def test_report_without_metrics_is_one_line(cli, tmp_path):
    r = cli("report", str(tmp_path / "none"))
    assert r.exit_code == 1 and "no such metrics file" in r.output and "Traceback" not in r.output
