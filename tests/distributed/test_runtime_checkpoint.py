"""Checkpoint save/resume through `orch launch`: a resumed run continues the loss trajectory exactly."""

import json
import shutil

import pytest

from orch.runtime.workdir.checkpoint import checkpoint_root
from orch.runtime.workdir.run_dir import choose_checkpoint


def latest_step(workdir):
    """The step a relaunch would resume from (None: no checkpoint)."""
    chosen = choose_checkpoint(workdir, None, tell=lambda line: None)
    return None if chosen is None else chosen.step


def _losses(workdir):
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records], [r["loss"] for r in records]


@pytest.mark.slow
def test_resumed_run_continues_the_loss_trajectory(cli, plan_file, tmp_path, train_config, capfd):
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

    capfd.readouterr()
    assert (r := cli(*base, "--steps", "3", "--workdir", str(part), "--resume")).exit_code == 0, r.output
    assert "names step_00000002, which is missing; scanning the step folders" in r.output
    # said by rank 0 once the ranks verified the checksums together (its own process's stderr)
    err = capfd.readouterr().err
    assert "orch: resuming from step_00000001 (verified)" in err
    # the one setting of the run changed since the checkpoint (checkpoint_every is a run option: not compared)
    assert [ln for ln in err.splitlines() if " changed since " in ln] == [
        "orch: steps changed since step_00000001: 2 -> 3"
    ]
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
    from orch.planner.loading import load_data
    from orch.planner.plan import DataParallel, Layout
    from orch.runtime.models.registry import load_model
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


def _tiny_plan(llm_layout, layers=None):
    from orch.planner.loading import load_data
    from orch.planner.plan import Layout
    from orch.runtime.models.registry import load_model
    from orch.runtime.plans import hand_plan

    model = load_model("tiny")
    if layers is not None:
        mods = dict(model.modules)
        mods["llm"] = mods["llm"].model_copy(update={"layers": layers})
        model = model.model_copy(update={"modules": mods})
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 64})
    return hand_plan(model, data, {"llm": (llm_layout, [0, 1]), "vision": (Layout(dp=2), [0, 1])}), data


def _flip(path, offset=64, n=4096):
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.slow
def test_resume_onto_a_new_layout_and_past_a_corrupted_checkpoint(tmp_path, capfd):
    """A run ends with a checkpoint of its last step (no checkpoint_every); the same model resumes from it on a
    TP layout instead of DP (DCP re-shards); a run whose newest checkpoint has 4 KB of flipped bytes resumes from
    the one before, saying so; another model into a workdir is refused and its plan.json kept."""
    from launching import train_local, train_runs

    from orch.planner.balance.mode import Mode
    from orch.planner.plan import Layout
    from orch.runtime.launch.local import LocalLauncher
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.workdir.run_dir import RunMismatch

    dp, data = _tiny_plan(Layout(dp=2))
    tp, _ = _tiny_plan(Layout(tp=2))

    def cfg(steps, **kw):
        return TrainConfig(steps=steps, seed=5, dtype="float64", lr=0.01, balance=Mode.NONE, **kw)

    first = train_runs(
        {
            "dp": (dp, data, cfg(4), tmp_path / "dp"),
            "tp": (tp, data, cfg(4), tmp_path / "tp"),
            "moved": (dp, data, cfg(2), tmp_path / "moved"),
            "flipped": (dp, data, cfg(3, checkpoint_every=1), tmp_path / "flipped"),
            "kept": (dp, data, cfg(4, checkpoint_every=1, keep_checkpoints=2), tmp_path / "kept"),
        }
    )
    # keep_checkpoints: the newest two, nothing half-deleted beside them
    assert sorted(p.name for p in checkpoint_root(tmp_path / "kept").iterdir()) == [
        "latest", "step_00000003", "step_00000004"
    ]  # fmt: skip
    assert len(first["moved"]) == 2
    assert [p.name for p in sorted(checkpoint_root(tmp_path / "moved").glob("step_*"))] == ["step_00000002"]
    _flip(checkpoint_root(tmp_path / "flipped") / "step_00000003" / "__1_0.distcp")
    capfd.readouterr()
    resumed = train_runs(
        {
            "moved": (tp, data, cfg(4), tmp_path / "moved"),
            "flipped": (dp, data, cfg(4), tmp_path / "flipped"),
            "sgd": (dp, data, cfg(5, optimizer="sgd"), tmp_path / "kept"),  # AdamW's state does not fit SGD
        },
        launcher=LocalLauncher(start_method="spawn"),  # rank 0 says which checkpoint the ranks verified
    )
    err = capfd.readouterr().err
    assert "orch: optimizer changed since step_00000004: adamw -> sgd: the model's weights are loaded" in err
    assert "orch: steps changed since step_00000004: 4 -> 5" in err
    assert [r.step for r in resumed["sgd"]] == [0, 1, 2, 3, 4]
    assert "the same model on a new layout (audio dp2 ranks 0-1 -> tp2 dp1 ranks 0-1; llm dp2" in err
    assert "orch: resuming from step_00000002 (verified)" in err
    assert "orch: skipping step_00000003: shard __1_0.distcp: checksum mismatch" in err
    assert [r.step for r in resumed["moved"]] == [0, 1, 2, 3] == [r.step for r in resumed["flipped"]]
    want_dp, want_tp = [r.loss for r in first["dp"]], [r.loss for r in first["tp"]]
    for g, w in zip([r.loss for r in resumed["flipped"]], want_dp, strict=True):
        assert g == pytest.approx(w, rel=1e-12, abs=0)  # steps 2-3 recomputed from step 2's checkpoint
    moved = [r.loss for r in resumed["moved"]]
    assert moved[:2] == want_dp[:2]
    for g, w in zip(moved[2:], want_tp[2:], strict=True):
        assert g == pytest.approx(w, rel=1e-9, abs=0)  # another layout: another summation order

    plan_before = (tmp_path / "dp" / "plan.json").read_text()
    other, _ = _tiny_plan(Layout(dp=2), layers=1)
    with pytest.raises(RunMismatch, match=r"holds a run of another model \(modules.llm.layers: 4 then, 1 now\)"):
        train_local(other, data, cfg(6), tmp_path / "dp")
    assert (tmp_path / "dp" / "plan.json").read_text() == plan_before


def test_a_full_disk_during_a_save_is_one_line_and_leaves_no_tmp(tmp_path, monkeypatch):
    import errno

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from orch.runtime.launch.procgroup import free_port
    from orch.runtime.workdir import checkpoint
    from orch.runtime.workdir.disk import NoSpaceError

    def full(*args, **kwargs):
        (tmp_path / "checkpoints" / "step_00000003.tmp" / "__0_0.distcp").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp, "save", full)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(NoSpaceError) as err:
            checkpoint.save(tmp_path, 3, {"m": torch.nn.Linear(2, 2)}, None, needs_bytes=4096)
    finally:
        dist.destroy_process_group()
    root = tmp_path / "checkpoints"
    assert str(err.value).startswith(f"{root}: no space left on device: a checkpoint needs about 4.0 KB (4096 bytes), ")
    assert list(root.iterdir()) == []  # the partial .tmp removed, nothing published


@pytest.mark.slow
def test_the_lock_is_freed_when_a_rank_fails_and_the_relaunch_resumes(tmp_path):
    from launching import train_local

    from orch.planner.balance.mode import Mode
    from orch.planner.plan import Layout
    from orch.runtime.launch.base import LaunchError
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.train.debug import DebugConfig
    from orch.runtime.workdir.run_lock import lock_path

    plan, data = _tiny_plan(Layout(dp=2))
    cfg = TrainConfig(steps=3, seed=5, dtype="float64", lr=0.01, balance=Mode.NONE, checkpoint_every=1)
    with pytest.raises(LaunchError, match="rank 1 failed: RuntimeError: injected failure at step 2"):
        train_local(plan, data, cfg, tmp_path, debug=DebugConfig(fail_at=(1, 2)))
    assert lock_path(tmp_path).read_text() == ""  # released by the launcher, not left to this process's exit
    records = train_local(plan, data, cfg, tmp_path)
    assert [r.step for r in records] == [0, 1, 2] and [r.setup_s > 0 for r in records] == [True, False, True]
