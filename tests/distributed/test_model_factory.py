"""`--model-factory`: users' own modules run under any plan and match the reference built by the same factory."""

import pytest
import torch
from equivalence import assert_close, merged
from launching import train_local

from orch.planner.errors import SpecError
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.models.factory import build_from_factory
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.single_process import run_reference

FACTORY = "factory_example:two_layer_projectors"
SEED = 5


@pytest.fixture(scope="module")
def specs():
    return load_model("tiny"), load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 96})


def test_factory_modules_are_the_users_and_seeded(specs):
    model, _ = specs
    a = build_from_factory(FACTORY, model, SEED, torch.float64)
    b = build_from_factory(FACTORY, model, SEED, torch.float64)
    assert type(a["vision"].projector).__name__ == "MLPProjector"
    assert a["audio"].is_audio and not a["vision"].is_audio
    for name in a:
        for (pa, ta), (pb, tb) in zip(a[name].named_parameters(), b[name].named_parameters(), strict=True):
            assert pa == pb and torch.equal(ta, tb)
            assert ta.dtype == torch.float64


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("factory_example", "expected package.module:function, got 'factory_example'"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("factory_example:nothing", "'factory_example' has no function 'nothing'"),
        ("factory_example:not_a_mapping", "must return one module per name"),
        (
            "factory_example:missing_llm",
            "must return one module per name ['audio', 'llm', 'vision'], got ['audio', 'vision']",
        ),
        ("factory_example:raises", "'factory_example:raises' raised ValueError: no GPU here"),
    ],
)
def test_factory_errors_name_the_flag(specs, ref, message):
    model, _ = specs
    with pytest.raises(SpecError, match="--model-factory") as info:
        build_from_factory(ref, model, SEED, torch.float64)
    assert message in str(info.value)


def test_cli_reports_a_bad_factory_in_one_line(cli, plan_file, tmp_path, train_config):
    path, _, _ = plan_file
    config = train_config(model_factory="factory_example:missing_llm")
    result = cli("launch", str(path), "--config", config, "--workdir", str(tmp_path))
    assert result.exit_code == 1
    want = f"error: {config}: model_factory: 'factory_example:missing_llm' must return one module per name"
    assert want in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_factory_model_matches_its_reference_under_tp_and_pp(specs, tmp_path):
    model, data = specs
    plan = hand_plan(
        model,
        data,
        {
            "llm": (Layout(tp=2, pp=2), [0, 1, 2, 3]),
            "vision": (Layout(dp=4), [0, 1, 2, 3]),
            "audio": (Layout(dp=4), [0, 1, 2, 3]),
        },
    )
    cfg = TrainConfig(
        optimizer="sgd", lr=0.1, steps=3, seed=SEED, dtype="float64", balance="none", model_factory=FACTORY
    )
    records = train_local(plan, data, cfg, tmp_path, debug=DebugConfig(dump_dir=str(tmp_path)))
    ref = run_reference(
        model, data, seed=SEED, steps=3, dtype=torch.float64, model_factory=FACTORY, optimizer="sgd", lr=0.1
    )
    for r, want in zip(records, ref.losses, strict=True):
        assert r.loss == pytest.approx(want, rel=1e-9, abs=0)
    assert "vision.projector.fc2.weight" in ref.grads
    assert_close(merged(tmp_path, "grads"), ref.grads, 1e-9)
    assert_close(merged(tmp_path, "params"), ref.params, 1e-8)
