"""A resumed run says each training setting it changed since its checkpoint (lr, seed, dtype, ...), one line each,
old -> new; and the new-layout line of a relaunch on another layout once."""

import json

import yaml

from orch.runtime.train.config import TrainSpec
from orch.runtime.train.trainer import say_changed_settings, train_file_text


def test_each_changed_setting_is_said_by_name_old_to_new(tmp_path, capsys):
    folder = tmp_path / "step_00000004"
    folder.mkdir()
    then = TrainSpec(steps=4, lr=0.01, seed=3, dtype="float64", module_lr={"vision": 2.0}, checkpoint_every=1)
    (folder / "train.json").write_text(train_file_text(then))
    now = then.model_copy(update={"steps": 8, "lr": 0.001, "seed": 4, "dtype": "float32", "module_lr": {},
                                  "optimizer": "sgd", "checkpoint_every": 2, "trace": "t.json"})  # fmt: skip
    changed = say_changed_settings(folder, now, rank=0)
    assert capsys.readouterr().err.splitlines() == [
        "orch: steps changed since step_00000004: 4 -> 8",
        "orch: seed changed since step_00000004: 3 -> 4",
        "orch: dtype changed since step_00000004: float64 -> float32",
        "orch: optimizer changed since step_00000004: adamw -> sgd: the model's weights are loaded, the optimizer's "
        "state starts fresh",
        "orch: lr changed since step_00000004: 0.01 -> 0.001",
        'orch: module_lr changed since step_00000004: {"vision": 2.0} -> {}',
    ]  # the run options (checkpoint_every, trace) change how, not what, it trains: not said
    assert changed["lr"] == (0.01, 0.001) and "checkpoint_every" not in changed
    assert say_changed_settings(folder, then, rank=0) == {} and capsys.readouterr().err == ""
    say_changed_settings(folder, now, rank=1)
    assert capsys.readouterr().err == ""  # rank 0 says it


def test_an_older_checkpoint_without_a_config_or_with_fewer_fields_compares_what_it_has(tmp_path, capsys):
    folder = tmp_path / "step_00000002"
    folder.mkdir()
    assert say_changed_settings(folder, TrainSpec(lr=0.5), rank=0) == {}
    (folder / "train.json").write_text(json.dumps({"lr": 0.25, "optimizer": "adamw"}))
    assert say_changed_settings(folder, TrainSpec(lr=0.5), rank=0) == {"lr": (0.25, 0.5)}
    assert capsys.readouterr().err == "orch: lr changed since step_00000002: 0.25 -> 0.5\n"


def test_a_relaunch_on_a_new_layout_says_it_once(cli, tmp_path, launched_tasks, capsys):
    """The launch's early check (another model is refused before a job is submitted) says nothing; preparing the run
    says the new layout, once."""
    from orch.planner.loading import load_data
    from orch.planner.plan import Layout
    from orch.runtime.models.registry import load_model
    from orch.runtime.plans import hand_plan

    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 64})
    workdir = tmp_path / "run"
    workdir.mkdir()
    dp = hand_plan(model, data, {"llm": (Layout(dp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})
    (workdir / "plan.json").write_text(dp.model_dump_json())
    tp = hand_plan(model, data, {"llm": (Layout(tp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(tp.model_dump(mode="json")))
    result = cli("launch", str(plan_file), "--workdir", str(workdir), "--device", "cpu")
    assert result.exit_code == 0, result.output
    task = launched_tasks[-1]
    task.prepare()  # what the launcher does before the ranks start
    task.release()
    said = result.output + capsys.readouterr().err
    assert said.count("orch: the same model on a new layout (") == 1, said
    assert "llm dp2 ranks 0-1 -> tp2 dp1 ranks 0-1" in said
