"""A diverging run (SGD at lr 1e4, float32): the step that went non-finite is recorded and named in one line, the
run exits non-zero, and no checkpoint of the broken weights is saved."""

import math

import pytest

from orch.runtime.workdir.checkpoint import checkpoint_root
from orch.runtime.workdir.metrics import read_metrics

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)


@pytest.mark.slow
def test_a_diverging_run_stops_at_the_step_in_one_line_and_keeps_the_last_good_checkpoint(
    cli, plan_file, tmp_path, train_config
):
    run = tmp_path / "run"
    config = train_config(optimizer="sgd", balance="none", checkpoint_every=1)
    result = cli("launch", str(plan_file[0]), "--config", config, "--lr", "1e4", "--steps", "6", "--nproc", "2",
                 "--workdir", str(run))  # fmt: skip
    assert result.exit_code == 1, result.output
    records = read_metrics(run / "metrics.jsonl")
    last = records[-1]
    assert 0 < last.step < 5 and all(math.isfinite(r.loss) and math.isfinite(r.grad_norm) for r in records[:-1])
    assert not math.isfinite(last.loss) or not math.isfinite(last.grad_norm)  # written, NaN and all
    newest = f"step_{last.step:08d}"  # saved after the step before the divergence
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: step {last.step + 1}/6: "), result.output
    assert errors[0].endswith(f"the run diverged; lower lr (now 10000), or set clip_norm or warmup_steps in the "
                              f"--config file; a relaunch resumes from {newest}, saved before it")  # fmt: skip
    assert (checkpoint_root(run) / "latest").read_text().strip() == newest
    assert sorted(p.name for p in checkpoint_root(run).glob("step_*"))[-1] == newest
