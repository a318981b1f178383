"""`orch launch --config train.yaml`: the file, the flags over it, and where the run keeps what it ran with;
the set of `orch launch` flags, pinned (docs/design.md, Spec files: flags do not mirror spec fields)."""

import json
import re
from importlib import resources

import pytest
import typer
import yaml

from orch.cli.app import app
from orch.cli.launch_cmd import DEPRECATED
from orch.planner.loading import load_json_file
from orch.runtime.train.config import TrainSpec
from orch.runtime.train.optim import lr_at

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

# Every flag `orch launch` takes. A new one needs a reason that a field of the --config file is not: add
# the field to TrainSpec instead (torchtitan's tests/unit_tests/test_no_new_cli_options.py).
FLAGS = {
    "--config", "--executor", "--nproc", "--workdir", "--data", "-d", "--steps", "--lr", "--dtype", "--seed",
    "--device", "--resume", "--no-resume", "--partition", "--account", "--qos", "--mem", "--time", "--setup",
    "--rdzv-endpoint", "--dry-run", "--wait", "--watchdog-s", "--report-to", "--help",
    "--tokenizer", "--index-dir", "--media-root", "--use-audio-in-video",  # how --data's conversation data is read, as `orch plan` takes them
}  # fmt: skip
# Fields of the --config file that were flags: accepted, with a warning, for one release (issue #28).
DEPRECATED_FLAGS = {
    "--optimizer", "--lr-schedule", "--warmup-steps", "--min-lr", "--clip-norm", "--weight-decay",
    "--checkpoint-every", "--balance", "--trace", "--load", "--loader-workers", "--model-factory",
}  # fmt: skip


def _launch_params():
    command = typer.main.get_command(app).commands["launch"]  # type: ignore[attr-defined]
    return command.params


def test_the_set_of_launch_flags_is_pinned():
    visible, hidden = set(), set()
    for param in _launch_params():
        names = [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
        (hidden if getattr(param, "hidden", False) else visible).update(n for n in names if n.startswith("-"))
    assert visible == FLAGS - {"--help"}
    assert hidden == DEPRECATED_FLAGS
    assert {"--" + f.replace("_", "-") for f in DEPRECATED} == DEPRECATED_FLAGS
    assert {f.lstrip("-").replace("-", "_") for f in DEPRECATED_FLAGS} <= set(TrainSpec.model_fields)


def test_help_shows_the_config_defaults(cli):
    result = cli("launch", "--help")
    assert result.exit_code == 0, result.output
    text = re.sub(r"[│\s]+", " ", result.output)
    spec = TrainSpec()
    for flag, value in (("--steps", spec.steps), ("--lr", spec.lr), ("--dtype", spec.dtype), ("--seed", spec.seed)):
        assert re.search(rf"{flag} .*?\[default: {re.escape(str(value))}\]", text), (flag, text)
    assert "[default: resume]" in text and "[default: auto]" in text
    assert not DEPRECATED_FLAGS & set(re.findall(r"--[a-z-]+", text))
    assert _launch_params()[[p.name for p in _launch_params()].index("steps")].default is None  # restored


def test_the_shipped_default_config_is_the_models_defaults():
    """templates/train/default.yaml lists every field at TrainSpec's default, for users to copy: no drift."""
    path = resources.files("orch.templates") / "train" / "default.yaml"
    doc = yaml.safe_load(path.read_text())
    assert set(doc) == set(TrainSpec.model_fields)
    assert load_json_file(TrainSpec, str(path)) == TrainSpec()
    demo = resources.files("orch.templates") / "train" / "demo-llava.yaml"
    assert load_json_file(TrainSpec, str(demo)).optimizer == "adamw"


def test_the_defaults_are_adamw():
    spec = TrainSpec()
    assert (spec.optimizer, spec.lr, spec.betas, spec.weight_decay, spec.steps) == ("adamw", 1e-4, (0.9, 0.95), 0.1, 3)


@pytest.mark.slow
def test_config_file_with_flags_over_it_is_what_the_run_keeps(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"optimizer": "adamw", "lr": 0.5, "lr_schedule": "cosine", "warmup_steps": 1,
                                      "steps": 9, "clip_norm": 1.0, "module_lr": {"vision": 2.0},
                                      "checkpoint_every": 3}))  # fmt: skip
    run = tmp_path / "run"
    result = cli("launch", str(path), "--config", str(config), "--steps", "3", "--lr", "0.02",
                 "--nproc", "2", "--workdir", str(run))  # fmt: skip
    assert result.exit_code == 0, result.output
    kept = TrainSpec.model_validate_json((run / "train.json").read_text())
    assert (kept.optimizer, kept.lr, kept.steps, kept.checkpoint_every, kept.module_lr) == (
        "adamw", 0.02, 3, 3, {"vision": 2.0},
    )  # fmt: skip
    assert (run / "checkpoints" / "step_00000003" / "train.json").read_text() == (run / "train.json").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records] == [lr_at(kept, k) for k in range(3)]
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
    result = cli("launch", str(path), "--steps", "0")
    assert result.exit_code == 1
    assert result.output.strip() == "error: --steps: expected a value > 0, got 0"
    result = cli("launch", str(path), "--dtype", "float16")
    assert result.output.strip() == "error: --dtype: expected one of float32, bfloat16, float64, got 'float16'"


def test_a_deprecated_flag_warns_in_one_line_and_is_checked_by_the_model(cli, plan_file):
    path, _, _ = plan_file
    result = cli("launch", str(path), "--lr-schedule", "exponential")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "warning: --lr-schedule is deprecated: set lr_schedule in the --config file",
        "error: --lr-schedule: expected one of constant, linear, cosine, got 'exponential'",
    ]
    result = cli("launch", str(path), "--clip-norm", "-1", "--optimizer", "sgd")
    assert result.output.strip().splitlines() == [
        "warning: --optimizer is deprecated: set optimizer in the --config file",
        "warning: --clip-norm is deprecated: set clip_norm in the --config file",
        "error: --clip-norm: expected a value >= 0, got -1.0",
    ]


def test_a_deprecated_flag_still_reaches_the_run(cli, plan_file, tmp_path, launched_tasks):
    config = tmp_path / "train.yaml"
    config.write_text("optimizer: adamw\nwarmup_steps: 2\nlr: 0.5\n")
    args = ["--config", str(config), "--optimizer", "sgd", "--lr", "0.25", "--no-resume", "--device", "cpu"]
    result = cli("launch", str(plan_file[0]), "--workdir", str(tmp_path / "run"), *args)
    assert result.exit_code == 0, result.output
    assert "warning: --optimizer is deprecated" in result.output
    cfg = launched_tasks[-1].cfg
    assert (cfg.optimizer, cfg.warmup_steps, cfg.lr, cfg.resume, cfg.device) == ("sgd", 2, 0.25, False, "cpu")


def test_a_non_finite_setting_is_refused_before_anything_runs(cli, plan_file, train_config, launched_tasks):
    """Every float of the config is finite (an infinite lr or a NaN factor trained as a divergence); AdamW's betas
    within [0, 1): each one line naming the flag or the file and field, a dry run too."""
    path = str(plan_file[0])
    result = cli("launch", path, "--lr", "inf", "--dry-run")
    assert (result.exit_code, result.output.strip()) == (1, "error: --lr: expected a finite number, got inf")
    for fields, line in (
        ({"min_lr": float("inf")}, "min_lr: expected a finite number, got inf"),
        ({"module_lr": {"vision": float("nan")}}, "module_lr.vision: expected a finite number, got nan"),
        ({"clip_norm": float("inf")}, "clip_norm: expected a finite number, got inf"),
        ({"betas": [0.9, 1.0]}, "betas: expected two values in [0, 1), got [0.9, 1.0]"),
        # finite, but AdamW's first step (lr / (1 - beta1)) overflows float32: torch refused it in every rank
        (
            {"lr": 1e38},
            "lr 1e+38: the optimizer's step size reaches 1e+39, more than the parameters' float32 holds (3.403e+38)",
        ),
        (
            {"lr": 1e30, "module_lr": {"vision": 1e10}, "optimizer": "sgd"},
            "lr 1e+30: the optimizer's step size reaches 1e+40, more than the parameters' float32 holds (3.403e+38)",
        ),
    ):
        config = train_config(**fields)
        result = cli("launch", path, "--config", config, "--dry-run")
        assert (result.exit_code, result.output.strip()) == (1, f"error: {config}: {line}")
    assert launched_tasks == []
