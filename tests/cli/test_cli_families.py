"""Every family the registry lists (runtime/models/registry.py), planned and launched through the CLI as a new user
would: a tiny model from its config, `orch plan --model`, then `orch launch` with DEFAULT settings (the start-up
calibration on), one CPU rank, one step; it must train. A family added to the registry is launched here
without a new test (and fails until tests/families.py can build a tiny one)."""

import json
import math

import pytest
from families import FAMILY_MODELS, ONE_RANK, data_for, plan_of, write_yaml

from orch.runtime.models.registry import FAMILIES, load_model


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_every_registered_family_trains_with_default_settings(model_type, cli, tmp_path, capfd):
    assert model_type in FAMILY_MODELS, f"{model_type} is registered: add a tiny one to tests/families.py"
    model = FAMILY_MODELS[model_type](tmp_path)
    cluster = write_yaml(tmp_path / "one-cpu.yaml", ONE_RANK)
    data = write_yaml(tmp_path / "data.yaml", data_for(load_model(str(model)).modules))
    plan_of(cli, model, data, tmp_path / "plan.yaml", cluster=str(cluster))
    run = tmp_path / "run"
    result = cli("launch", str(tmp_path / "plan.yaml"), "--steps", "1", "--workdir", str(run))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0]
    assert math.isfinite(records[0]["loss"]) and records[0]["loss"] > 0
    assert math.isfinite(records[0]["grad_norm"]) and records[0]["grad_norm"] > 0
    # the default calibrates every module (rank 0 says so), and the rank took its costs
    said = capfd.readouterr().err
    assert "orch: calibrated llm " in said, said
