"""Checkpoint save/resume through `orch launch`: a resumed run continues the loss trajectory exactly."""

import json
import shutil

import pytest

from orch.runtime.checkpoint import checkpoint_root
from orch.runtime.run_dir import choose_checkpoint


def latest_step(workdir):
    """The step a relaunch would resume from (None: no checkpoint)."""
    chosen = choose_checkpoint(workdir, None, tell=lambda line: None)
    return None if chosen is None else chosen.step


def _losses(workdir):
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records], [r["loss"] for r in records]


@pytest.mark.slow
def test_resumed_run_continues_the_loss_trajectory(cli, plan_file, tmp_path, train_config):
    plan_file, _, _ = plan_file
    base = ["launch", str(plan_file), "--nproc", "2", "--seed", "3", "--dtype", "float64"]
    full, part = tmp_path / "full", tmp_path / "part"
    every_step = train_config(checkpoint_every=1)
    # resumed after step 0: step 1 runs on the loaded parameters, step 2 on an update from loaded optimizer state
    assert (r := cli(*base, "--steps", "3", "--workdir", str(full))).exit_code == 0, r.output
    assert (r := cli(*base, "--steps", "2", "--workdir", str(part), "--config", every_step)).exit_code == 0, r.output
    root = checkpoint_root(part)
    assert (root / "latest").read_text().strip() == "step_00000002"
    assert latest_step(part) == 2 and not list(root.glob("*.tmp"))
    shutil.rmtree(root / "step_00000002")  # resume from step 1: `latest` names a deleted folder
    (root / "step_00000002.tmp").mkdir()  # an interrupted save: garbage that must never be loaded
    (root / "step_00000002.tmp" / ".metadata").write_text("garbage")

    assert (r := cli(*base, "--steps", "3", "--workdir", str(part), "--resume")).exit_code == 0, r.output
    assert "names step_00000002, which is missing; scanning the step folders" in r.output
    assert "orch: resuming from step_00000001 (verified)" in r.output
    want_steps, want = _losses(full)
    got_steps, got = _losses(part)
    assert got_steps == want_steps == [0, 1, 2]  # metrics appended
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-12, abs=0)


@pytest.mark.slow
def test_resume_with_pipeline_experts_and_context_parallel_shards(tmp_path):
    """PP stages, local experts, CP-sharded encoders and FSDP2 shards save and load their own shards (AdamW state
    too)."""
    from launching import train_local, train_runs

    from orch.planner.balance.mode import Mode
    from orch.planner.loading import load_data, load_model
    from orch.planner.plan import DataParallel, Layout
    from orch.runtime.plans import hand_plan
    from orch.runtime.train.config import TrainConfig

    model = load_model("tiny-moe")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 96})
    layouts = {
        "llm": (Layout(pp=2, dp=2, ep=2), [0, 1, 2, 3]),
        "vision": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    }
    # FSDP2 shards (the LLM's dense weights over dp, the vision tower's over the flattened (dp, cp)), a
    # replicated audio tower, and experts outside FSDP2
    dp = {"llm": DataParallel.FSDP, "vision": DataParallel.FSDP, "audio": DataParallel.REPLICATE}
    plan = hand_plan(model, data, layouts, data_parallel=dp)

    def cfg(steps, **kw):
        return TrainConfig(steps=steps, seed=4, dtype="float64", optimizer="adamw", lr=0.01, balance=Mode.NONE, **kw)

    # saved after step 0: step 1 runs on the loaded shards, step 2 on an update from the loaded AdamW state.
    # The uninterrupted run and the first part (own workdirs) share a launch; the resume is a new one.
    runs = {
        "full": (plan, data, cfg(3), tmp_path / "full"),
        "part": (plan, data, cfg(1, checkpoint_every=1), tmp_path / "part"),
    }
    done = train_runs(runs)
    want, first = [r.loss for r in done["full"]], done["part"]
    assert len(want) == 3 and len(first) == 1
    assert latest_step(tmp_path / "part") == 1  # the final checkpoint of a 1-step run
    resumed = train_local(plan, data, cfg(3), tmp_path / "part")
    assert [r.step for r in resumed] == [0, 1, 2]
    assert resumed[:1] == first  # step 0 is the first run's record: the second run started at step 1
    for g, w in zip([r.loss for r in resumed], want, strict=True):
        assert g == pytest.approx(w, rel=1e-12, abs=0)
