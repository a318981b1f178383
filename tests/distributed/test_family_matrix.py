"""Every multimodal family the registry lists, and LLaVA with other towers and LLMs, under orch's plans, held in
float64 against the HF model's own forward and backward (tests/family_matrix.py: the rows, the plan kinds, the
cells run here; bench/bench_family_matrix.py runs every cell). Per cell: the step-0 loss over the whole batch
equals HF's (1e-9 relative) and so does the gradient of every parameter (1e-9 of the tensor's largest entry).
A family added to the registry is a row here without a new test, failing until the tests can build and
reference it. All cells of one world size run in ONE launch, only those the session selected (`-k`)."""

import pytest
from equivalence import assert_matches_hf
from family_matrix import (
    PLAN_KINDS,
    ROWS,
    TESTED,
    build_row,
    cell_name,
    cell_plan,
    cells_under_test,
    run_cells,
    train_config,
)

from orch.planner.model_dir import Role, types_of
from orch.runtime.data.synthetic import SyntheticBatch
from orch.runtime.models.registry import FAMILIES


def selected(request, argname: str) -> list:
    """The values of this module's parameter `argname` over the tests the session runs (after -k)."""
    return [
        item.callspec.params[argname]
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and argname in getattr(getattr(item, "callspec", None), "params", {})
    ]


@pytest.fixture(scope="module")
def built(request, tmp_path_factory):
    """Every row a selected test needs, built with its HF reference: row name -> Built."""
    root = tmp_path_factory.mktemp("family-matrix")
    rows = {cell[0] for cell in selected(request, "cell")} | set(selected(request, "row"))
    return {r: build_row(ROWS[r], root) for r in sorted(rows) if ROWS[r].missing is None}


@pytest.fixture(scope="module")
def ran(request, built, tmp_path_factory):
    """Every selected cell trained one step (one launch per world size): (records, cell name -> folder)."""
    cells = [c for c in selected(request, "cell") if c[0] in built]
    return run_cells(cells, built, tmp_path_factory.mktemp("family-matrix-runs"))


def test_every_registered_multimodal_family_is_a_row():
    assert set(types_of(FAMILIES, Role.MODEL)) <= set(ROWS)
    for model_type in types_of(FAMILIES, Role.MODEL):
        assert ROWS[model_type].missing is None, ROWS[model_type].missing


@pytest.mark.slow
@pytest.mark.parametrize("row", list(ROWS))
def test_batch_mixes_text_only_samples_and_each_encoders_media(built, row):
    """The batch the cells train holds samples without media and samples with each encoder's."""
    if ROWS[row].missing:
        pytest.fail(ROWS[row].missing)
    model = built[row].model
    batch = SyntheticBatch.build(model, ROWS[row].data, ROWS[row].seed, 0)
    media = [{e for e, n in batch.enc_tokens[i].items() if n} for i in range(batch.size)]
    assert set() in media, media
    assert all(any(e in m for m in media) for e in model.encoder_names), media


@pytest.mark.slow
@pytest.mark.parametrize("row", ["qwen2_5_omni"])
def test_two_tower_cells_hold_ranks_without_a_towers_media(built, row):
    """The two-tower row's FSDP keep and reshard cells (homogeneous, zero3_homogeneous: test_plan_matches_hf)
    train a step where a DP rank holds no image at all and a DP rank's micro-batch no audio, under the cells' own
    dispatch: there the rank still makes the tower's collective calls (its placeholder) and the step equals HF's."""
    import torch

    from orch.runtime.parallel.grid import build_grids
    from orch.runtime.train.inputs import InputRouter
    from orch.runtime.train.post_balance import PostBalancer, lengths_columns

    model, data = built[row].model, ROWS[row].data
    lengths = lengths_columns(model, SyntheticBatch.build(model, data, ROWS[row].seed, 0))
    for kind in ("homogeneous", "zero3_homogeneous"):
        assert kind in TESTED[row]
        plan = cell_plan(ROWS[row], PLAN_KINDS[kind], model)
        grids = build_grids(plan.modules)
        tables = PostBalancer(plan, grids, train_config(ROWS[row]).balance, 8).dispatch(0, lengths)
        router = InputRouter(plan, grids, 0, 4, torch.device("cpu"), balanced=True)

        assert without_media("vision", tables, router, lengths)[0], (kind, tables.dest)
        assert without_media("audio", tables, router, lengths)[1], (kind, tables.dest)


def without_media(tower: str, tables, router, lengths: dict[str, list[int]]) -> tuple[list[int], list[int]]:
    """The DP indices of `tower` that hold none of its media this step; those with a micro-batch holding none."""
    held = [tables.held(tower, j) for j in range(tables.dp[tower])]
    calls = router.calls(tower, tables)
    none = [j for j, ids in enumerate(held) if not any(lengths[tower][i] for i in ids)]
    chunks = [router.chunks(tower, ids, calls) for ids in held]
    return none, [j for j, cs in enumerate(chunks) if any(not any(lengths[tower][i] for i in c) for c in cs)]


@pytest.mark.slow
@pytest.mark.parametrize("cell", cells_under_test(), ids=[cell_name(*c) for c in cells_under_test()])
def test_plan_matches_hf(built, ran, cell):
    row, kind = cell
    if ROWS[row].missing:
        pytest.fail(ROWS[row].missing)
    why = PLAN_KINDS[kind].refusal(built[row].model)
    assert why is None, f"{cell_name(row, kind)} is tested but the family refuses it: {why}"
    records, folders = ran
    name = cell_name(row, kind)
    assert_matches_hf(records, name, folders[name], *built[row].want)
