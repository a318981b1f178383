"""Training on a data file (conversations with images and audio, runtime/data/source.py) under every placement:
float64 losses (1e-9) and parameters (1e-8) equal the single-process reference on the same samples; every
sample of a global batch runs once per module with all its tokens; loading at the destination moves no input
byte and trains the same as loading at the origin; a sample whose image vanished is masked and listed, not fatal."""

import shutil
from pathlib import Path

import pytest
import torch
from equivalence import assert_close, merged
from launching import train_local, train_runs, train_tasks

from orch.cli.data_cmd import conversation_data
from orch.planner.plan import Layout
from orch.runtime.data.demo_data import make_dataset, make_tokenizer
from orch.runtime.data.source import BatchSource
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.post_balance import lengths_columns
from orch.runtime.train.single_process import run_reference

STEPS, SEED = 2, 5
ENC_DP4 = {"vision": (Layout(dp=4), [0, 1, 2, 3]), "audio": (Layout(dp=4), [0, 1, 2, 3])}
PLANS = {
    "homogeneous_dp4": {"llm": (Layout(dp=4), [0, 1, 2, 3])},
    "colocated_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), **ENC_DP4},
    "colocated_llm_cp2_dp2": {"llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]), **ENC_DP4},
    "colocated_llm_pp2_dp2": {"llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]), **ENC_DP4},
    "disaggregated_enc1_llm_dp3": {
        "llm": (Layout(dp=3), [1, 2, 3]),
        "vision": (Layout(dp=1), [0]),
        "audio": (Layout(dp=1), [0]),
    },
}
ORIGIN = "homogeneous_dp4_loaded_at_origin"
WORKERS = "colocated_llm_tp2_dp2_loader_processes"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-data")
    data_file = make_dataset(root, images=10, tones=6)
    tok = make_tokenizer(root / "tok" / "tokenizer.json")
    model = load_model("tiny")
    data, _ = conversation_data(model, str(data_file), 8, None, str(tok))
    return root, model, data


@pytest.fixture(scope="module")
def launched(dataset, tmp_path_factory):
    root, model, data = dataset
    plans = {name: hand_plan(model, data, layouts) for name, layouts in PLANS.items()}
    plans[ORIGIN] = hand_plan(model, data, PLANS["homogeneous_dp4"])
    plans[WORKERS] = hand_plan(model, data, PLANS["colocated_llm_tp2_dp2"])
    cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64")
    cfgs = {name: cfg for name in PLANS} | {
        ORIGIN: TrainConfig(optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64", load="origin"),
        WORKERS: TrainConfig(
            optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64", loader_workers=2
        ),  # decoding in processes
    }
    out = tmp_path_factory.mktemp("runs")
    return train_tasks(plans, data, cfgs, out, debug=DebugConfig(count_tokens=True)), out


@pytest.fixture(scope="module")
def reference(dataset):
    """The single-process run on the same samples, once for every plan."""
    _, model, data = dataset
    return run_reference(model, data, seed=SEED, steps=STEPS, dtype=torch.float64, optimizer="sgd", lr=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*PLANS, ORIGIN, WORKERS])
def test_plan_on_a_data_file_matches_the_reference(name, dataset, launched, reference):
    root, model, data = dataset
    records, out = launched
    ref = reference
    assert [r.loss for r in records[name]] == pytest.approx(ref.losses, rel=1e-9)
    assert_close(merged(out / name, "params"), ref.params, rel=1e-8)
    batches = BatchSource(model, data, SEED)
    for r in records[name]:
        # each sample's inputs built once per encoder, on the one rank that runs it (encoders at DP 4 or 1)
        assert r.data == {"samples": 8, "skipped": 0, "truncated": 0, "failed": 0, "decoded": 8 * 2}
        want = lengths_columns(model, batches.build(r.step))
        assert r.tokens == batches.build(r.step).label_tokens  # the assistant turns' tokens only
        for module, column in want.items():
            seen: dict[int, int] = {}
            for per_rank in (r.processed or {}).values():
                for sid, n in per_rank.get(module, {}).items():
                    assert int(sid) not in seen, f"step {r.step}: sample {sid} ran twice in {module}"
                    seen[int(sid)] = n
            assert seen == dict(enumerate(column)), f"step {r.step}: {module}"


@pytest.mark.slow
def test_loading_at_the_destination_moves_no_input_byte(launched):
    records, _ = launched
    for here, there in zip(records["homogeneous_dp4"], records[ORIGIN], strict=True):
        moved = sum(
            there.balance[p]["intra_node_bytes"] + there.balance[p]["inter_node_bytes"] for p in ("vision", "audio")
        )
        assert moved > 0 and there.balance["input_bytes_avoided"] == 0
        assert all(
            here.balance[p]["intra_node_bytes"] == here.balance[p]["inter_node_bytes"] == 0 for p in ("vision", "audio")
        )
        assert here.balance["input_bytes_avoided"] >= moved  # the encoders' inputs and the text


@pytest.fixture(scope="module")
def two_ranks(dataset, tmp_path_factory):
    """The 2-rank runs of the tests below, in ONE launch: a copy of the data whose images all vanished after
    indexing but one of step 0's, cut to its header (it opens, its pixels do not decode), and the 4-step run and
    the 2-step checkpointed run the resume test continues."""
    root, model, data = dataset
    base = tmp_path_factory.mktemp("two-ranks")
    copy = base / "data"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".orch-index"))
    spec, _ = conversation_data(model, str(copy / "data.jsonl"), 8, None, str(copy / "tok" / "tokenizer.json"))
    source = BatchSource(model, spec, SEED).files
    assert source is not None
    first = next(Path(c.images[0]) for row in source.rows_of_step(SEED, 0) if (c := source.conversation(row)).images)
    for image in sorted((copy / "media").glob("img_*.png")):
        if image == first:
            image.write_bytes(image.read_bytes()[:60])
        else:
            image.unlink()  # gone after indexing
    dp2 = {"llm": (Layout(dp=2), [0, 1])}
    runs = {
        "vanished": (
            hand_plan(model, spec, dp2),
            spec,
            TrainConfig(optimizer="sgd", lr=0.1, steps=2, seed=SEED, dtype="float64"),
            base / "run",
        ),
        "full": (hand_plan(model, data, dp2), data, _resume_cfg(4), base / "full"),
        "part": (hand_plan(model, data, dp2), data, _resume_cfg(2, checkpoint_every=2), base / "part"),
    }
    return train_runs(runs), spec, base


def _resume_cfg(steps, **kw):
    return TrainConfig(steps=steps, seed=SEED, dtype="float64", optimizer="adamw", lr=0.01, **kw)


@pytest.mark.slow
def test_a_vanished_or_cut_image_masks_its_sample_and_is_listed(dataset, two_ranks):
    from orch.runtime.data.problems import read_problems

    _, model, _ = dataset
    runs, spec, base = two_ranks
    records = runs["vanished"]
    assert len(records) == 2 and all(r.loss > 0 for r in records)
    ref = run_reference(model, spec, seed=SEED, steps=2, dtype=torch.float64, optimizer="sgd", lr=0.1)
    assert [r.loss for r in records] == pytest.approx(ref.losses, rel=1e-9)  # the same samples left out
    source = BatchSource(model, spec, SEED).files
    assert source is not None
    cut = [p for p in (Path(spec.source).parent / "media").glob("img_*.png")]
    assert len(cut) == 1
    # every sample with an image is found where it is decoded (all but one image vanished, that one cut)
    masked = [[i for i, row in enumerate(source.rows_of_step(SEED, r.step)) if source.conversation(row).images]
              for r in records]  # fmt: skip
    assert all(masked) and [r.data["skipped"] for r in records] == [0, 0]
    assert [r.data["failed"] for r in records] == [len(m) for m in masked]
    built = [BatchSource(model, spec, SEED).build(r.step) for r in records]
    assert [r.tokens for r in records] == [b.without(set(m)).label_tokens for b, m in zip(built, masked, strict=True)]
    assert records[0].tokens < built[0].label_tokens  # the masked samples trained nothing
    listed = read_problems(str(base / "run" / "data_problems.jsonl"))
    assert listed and all(p["action"] == "masked" for p in listed)
    drawn = {source.conversation(source.rows_of_step(SEED, r.step)[i]).where
             for r, ids in zip(records, masked, strict=True) for i in ids}  # fmt: skip
    assert {f"{p['file']}:{p['line']}" for p in listed} == drawn
    assert {p["medium"] for p in listed if Path(str(p["medium"])).exists()} == {str(cut[0])}


@pytest.mark.slow
def test_a_resumed_run_draws_the_same_batches(dataset, two_ranks):
    import json

    root, model, data = dataset
    runs, _, base = two_ranks
    plan = hand_plan(model, data, {"llm": (Layout(dp=2), [0, 1])})
    want = [r.loss for r in runs["full"]]  # 32 samples: past the 17 of the first epoch
    assert len(want) == 4
    saved = json.loads((base / "part" / "checkpoints" / "step_00000002" / "data.json").read_text())
    assert saved["epoch"] == 0 and saved["position"] == 16 and saved["index"] == data.manifest
    resumed = train_local(plan, data, _resume_cfg(4), base / "part")  # a new launch continues the checkpoint
    assert [r.loss for r in resumed] == pytest.approx(want, rel=1e-12)
    other = data.model_copy(update={"manifest": data.manifest.replace(".jsonl", "-other.jsonl")})
    Path(other.manifest).write_text(Path(data.manifest).read_text())
    Path(other.manifest).with_suffix(".json").write_text(Path(data.manifest).with_suffix(".json").read_text())
    cfg = TrainConfig(steps=6, seed=SEED, dtype="float64", optimizer="adamw", lr=0.01)
    from orch.runtime.launch.base import LaunchError

    with pytest.raises(LaunchError, match="the checkpoint drew its batches from"):  # another index: refused
        train_local(hand_plan(model, other, {"llm": (Layout(dp=2), [0, 1])}), other, cfg, base / "part")
