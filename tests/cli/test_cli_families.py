"""Every family the registry lists (runtime/models/registry.py), planned and launched through the CLI as a new user
would: a tiny model from its config, `orch plan --model`, then `orch launch` with DEFAULT settings (the start-up
calibration on), one CPU rank, one step; it must train. A family added to the registry is launched here
without a new test (and fails until tests/families.py can build a tiny one).

`CLI_LAUNCHED` is launched by `orch launch` itself (its own spawned rank, what users run). Every other family's
run is what `orch launch` checks and builds for it (cli/launch_cmd.py `checked_run`, the same TrainTask), all of
them in ONE launch of one rank, one after another: a family more costs its run, not a process start and the
imports of torch and transformers."""

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from families import FAMILY_MODELS, ONE_RANK, data_for, write_yaml

from orch.runtime.models.registry import FAMILIES, load_model

CLI_LAUNCHED = "llava"


@dataclass
class Planned:
    """A family's tiny model planned by `orch plan`: the plan file, the command's result, the run's folder."""

    plan: Path
    result: object  # typer's Result
    run: Path


@dataclass
class SaidApart:
    """One family's run in the shared launch: rank 0's stderr written to WORKDIR/stderr.txt, and what it raised
    recorded in WORKDIR/.failures (as a failing rank's is) instead of ending the launch: the next family runs."""

    task: object  # a TrainTask

    @property
    def world_size(self) -> int:
        return self.task.world_size

    @property
    def workdir(self) -> str:
        return self.task.workdir

    @property
    def device(self) -> str:
        return self.task.device

    @property
    def timeout_s(self) -> float:
        return self.task.timeout_s

    def prepare(self) -> None:
        self.task.prepare()

    def run(self, ctx) -> None:
        from orch.runtime.launch.failures import record_failure

        sys.stderr.flush()
        saved = os.dup(2)
        with open(Path(self.workdir) / "stderr.txt", "w") as said:
            os.dup2(said.fileno(), 2)
            try:
                self.task.run(ctx)
            except Exception as exc:  # the family's test reports it
                record_failure(self.workdir, ctx.env.rank, exc)
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)

    def result(self) -> object:
        return self.task.result()

    def release(self) -> None:
        self.task.release()


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[str, Planned]:
    """`orch plan` of every registered family tests/families.py can build, on one CPU rank: model_type -> Planned."""
    from typer.testing import CliRunner

    from orch.cli.app import app

    root = tmp_path_factory.mktemp("families")
    cluster = write_yaml(root / "one-cpu.yaml", ONE_RANK)
    out = {}
    for model_type in FAMILIES:
        if model_type not in FAMILY_MODELS:
            continue
        folder = root / model_type
        folder.mkdir()
        model = FAMILY_MODELS[model_type](folder)
        data = write_yaml(folder / "data.yaml", data_for(load_model(str(model)).modules))
        args = ["--model", str(model), "--cluster", str(cluster), "--data", str(data)]
        result = CliRunner().invoke(app, ["plan", *args, "--out", str(folder / "plan.yaml")])
        out[model_type] = Planned(folder / "plan.yaml", result, folder / "run")
    return out


@pytest.fixture(scope="module")
def launched(planned) -> dict[str, str]:
    """Every planned family but CLI_LAUNCHED, as `orch launch PLAN --steps 1 --workdir RUN` checks and builds its
    run, trained in ONE launch (the tests' forkserver launcher, one rank): model_type -> the line `orch launch`
    refused it with, for those refused before the launch."""
    from launching import LAUNCHER

    from orch.cli.launch_cmd import checked_run
    from orch.planner.errors import OrchError
    from orch.runtime.launch.base import TaskSequence
    from orch.runtime.train.trainer import TrainTask

    tasks, refused = [], {}
    for model_type, p in planned.items():
        if model_type == CLI_LAUNCHED or p.result.exit_code != 0:
            continue
        try:
            run = checked_run(str(p.plan), None, {"steps": 1}, "local", None, str(p.run), *[None] * 4, False)
        except OrchError as exc:
            refused[model_type] = str(exc)
            continue
        tasks.append(SaidApart(TrainTask(run.plan, run.data, run.cfg, run.workdir)))
    if tasks:
        LAUNCHER.submit(TaskSequence(tasks)).result()
    return refused


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_every_registered_family_trains_with_default_settings(model_type, planned, launched, cli, capfd):
    from orch.runtime.launch.failures import first_failure_record

    assert model_type in FAMILY_MODELS, f"{model_type} is registered: add a tiny one to tests/families.py"
    p = planned[model_type]
    assert p.result.exit_code == 0, p.result.output
    run = p.run
    if model_type == CLI_LAUNCHED:
        capfd.readouterr()
        result = cli("launch", str(p.plan), "--steps", "1", "--workdir", str(run))
        assert result.exit_code == 0, result.output
        said = capfd.readouterr().err
    else:
        assert model_type not in launched, launched[model_type]
        assert first_failure_record(run) is None, first_failure_record(run)
        said = (run / "stderr.txt").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0]
    assert math.isfinite(records[0]["loss"]) and records[0]["loss"] > 0
    assert math.isfinite(records[0]["grad_norm"]) and records[0]["grad_norm"] > 0
    # the default calibrates every module (rank 0 says so), and the rank took its costs
    assert "orch: calibrated llm " in said, said
