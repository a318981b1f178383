"""The one per-sample cost model (planner/sample_cost.py) and the files that carry it: profiles, batches, plans."""

import json

import numpy as np
import pytest

from orch.planner.balance.batch import Batch, PhaseSpec
from orch.planner.balance.cost import build_phase_arrays, sample_costs
from orch.planner.errors import OrchError
from orch.planner.loading import load_json_file
from orch.planner.profile import ComputeFit, ModuleProfile, Profile
from orch.planner.sample_cost import SampleCost

COST = SampleCost(call=5.0, constant=2.0, linear=3.0, quadratic=0.5)


def test_per_sample_is_the_polynomial_and_nothing_at_length_zero():
    assert COST.per_sample(4.0) == 2.0 + 3.0 * 4 + 0.5 * 16
    assert COST.per_sample(0.0) == 0.0  # absent from the phase: not even the constant
    lengths = np.array([0, 1, 4, 10], dtype=np.float64)
    assert COST.per_sample(lengths).tolist() == [0.0, 5.5, 22.0, 82.0]
    assert SampleCost(linear=1.0).per_sample(lengths).tolist() == [0.0, 1.0, 4.0, 10.0]


def test_per_call_total_scaled_and_plus_agree_with_the_polynomial():
    assert COST.per_call(3, 4) == 5.0 + 3 * 22.0
    lens = [1, 4, 10]
    assert COST.total(len(lens), sum(lens), sum(n * n for n in lens), calls=2) == 2 * 5.0 + 5.5 + 22.0 + 82.0
    half = COST.scaled(2.0, tokens=0.5)  # twice the work, half of every sample's tokens on this rank
    assert (half.call, half.constant, half.linear, half.quadratic) == (10.0, 4.0, 3.0, 0.5)
    both = COST.plus(SampleCost(call=1.0, linear=1.0))
    assert (both.call, both.constant, both.linear, both.quadratic) == (6.0, 2.0, 4.0, 0.5)
    fit = ComputeFit(constant=1.0, linear=2.0, rel_error=0.1)
    assert fit.terms() == SampleCost(constant=1.0, linear=2.0) and type(fit.terms()) is SampleCost


def test_a_phase_is_the_cost_model_and_the_dispatcher_reads_its_per_sample_terms():
    spec = PhaseSpec(**COST.model_dump(), max_tokens=64)
    assert isinstance(spec, SampleCost)
    lengths = np.array([0, 1, 4, 10], dtype=np.int64)
    assert sample_costs(lengths, spec).tolist() == COST.per_sample(lengths.astype(np.float64)).tolist()
    ph = build_phase_arrays("llm", spec, lengths, np.zeros(4, dtype=np.int64), lengths, 2, 2)
    assert ph.costs.tolist() == [5.5, 22.0, 82.0]
    assert PhaseSpec().linear == 1.0 and PhaseSpec().constant == 0.0  # a batch file's `{}`: a token costs 1


def test_batch_files_keep_their_names_and_may_give_a_call_term():
    old = {"num_ranks": 2, "ranks_per_node": 2, "phases": {"llm": {"constant": 1.0, "quadratic": 0.01}}}
    assert Batch.model_validate(old).phases["llm"] == PhaseSpec(constant=1.0, linear=1.0, quadratic=0.01)
    new = {**old, "phases": {"llm": {"call": 3.0, "constant": 1.0, "quadratic": 0.01}}}
    assert Batch.model_validate(new).phases["llm"].call == 3.0


def test_an_old_profile_loads_with_its_coefficient_names(tmp_path):
    """Profiles written before issue 28 name the terms c0, c1, c2 and call_s."""
    block = {"c0": 1e-4, "c1": 2e-6, "c2": 1e-9, "call_s": 5e-4, "rel_error": 0.05, "memory_bytes_per_token": 4096}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"device": "cpu", "backend": "gloo", "modules": {"llm": {"block": {"1": block}}}}))
    fit = load_json_file(Profile, str(path)).modules["llm"].block[1]
    assert fit == ComputeFit(
        call=5e-4, constant=1e-4, linear=2e-6, quadratic=1e-9, rel_error=0.05, memory_bytes_per_token=4096
    )
    again = Profile(device="cpu", backend="gloo", modules={"llm": ModuleProfile(block={1: fit})})
    written = json.loads(again.model_dump_json())["modules"]["llm"]["block"]["1"]
    assert {"call", "constant", "linear", "quadratic"} <= set(written) and "c0" not in written


def test_a_profile_with_both_names_of_a_term_is_one_clear_line(tmp_path):
    path = tmp_path / "both.json"
    block = {"c0": 1e-4, "constant": 2e-4, "linear": 1e-6}
    path.write_text(json.dumps({"device": "cpu", "backend": "gloo", "modules": {"llm": {"block": {"1": block}}}}))
    with pytest.raises(OrchError) as err:
        load_json_file(Profile, str(path))
    text = str(err.value)
    assert len(text.splitlines()) == 1
    assert str(path) in text and "modules.llm.block.1" in text and "c0" in text and "constant" in text
