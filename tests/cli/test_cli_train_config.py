"""`orch launch --config train.yaml`: the file, the flags over it, and where the run keeps what it ran with."""

import json

import pytest
import yaml

from orch.runtime.train.config import TrainSpec
from orch.runtime.train.optim import lr_at


@pytest.mark.slow
def test_config_file_with_flags_over_it_is_what_the_run_keeps(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"optimizer": "adamw", "lr": 0.02, "lr_schedule": "cosine", "warmup_steps": 1,
                                      "steps": 9, "clip_norm": 1.0, "module_lr": {"vision": 2.0}}))  # fmt: skip
    run = tmp_path / "run"
    result = cli("launch", str(path), "--config", str(config), "--steps", "3", "--checkpoint-every", "3",
                 "--nproc", "2", "--workdir", str(run))  # fmt: skip
    assert result.exit_code == 0, result.output
    kept = TrainSpec.model_validate_json((run / "train.json").read_text())
    assert (kept.optimizer, kept.lr, kept.steps, kept.checkpoint_every, kept.module_lr) == (
        "adamw", 0.02, 3, 3, {"vision": 2.0},
    )  # fmt: skip
    assert (run / "checkpoints" / "step_00000003" / "train.json").read_text() == (run / "train.json").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    cfg = kept.config()
    assert [r["lr"] for r in records] == [lr_at(cfg, k) for k in range(3)]
    assert all(r["grad_norm"] > 0 for r in records)


def test_a_bad_config_field_is_one_line(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    config = tmp_path / "train.yaml"
    config.write_text("lr_schedule: exponential\n")
    result = cli("launch", str(path), "--config", str(config))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {config}: lr_schedule: "), result.output


def test_a_bad_flag_is_named(cli, plan_file):
    path, _, _ = plan_file
    result = cli("launch", str(path), "--lr-schedule", "exponential")
    assert result.output.strip() == "error: --lr-schedule: expected one of constant, linear, cosine, got 'exponential'"
    result = cli("launch", str(path), "--clip-norm", "-1")
    assert result.output.strip() == "error: --clip-norm: expected a value >= 0, got -1.0"
