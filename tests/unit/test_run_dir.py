"""A run directory at launch (runtime/workdir/run_dir.py): its lock, the checks of what it holds, the checkpoint a run
resumes from (fall-back order, skipped ones named), --no-resume's move aside, and a full disk's one line."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.workdir.checkpoint_manifest import MANIFEST, Manifest, file_sum, verify
from orch.runtime.workdir.disk import NoSpaceError, check_free, no_space_guard
from orch.runtime.workdir.run_dir import (
    RunMismatch,
    check_same_model,
    choose_checkpoint,
    move_aside,
    open_run,
    step_name,
)
from orch.runtime.workdir.run_identity import differences, fingerprint, model_identity
from orch.runtime.workdir.run_lock import Holder, RunLock, RunLocked, lock_path, probe, read_holder


def _plan(layers=2, llm=None):
    model = load_model("tiny")
    if layers != model.modules["llm"].layers:
        mods = dict(model.modules)
        mods["llm"] = mods["llm"].model_copy(update={"layers": layers})
        model = model.model_copy(update={"modules": mods})
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 64})
    return hand_plan(model, data, {"llm": (llm or Layout(dp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})


# DCP's Metadata, empty, as a pickle (GLOBAL, EMPTY_TUPLE, NEWOBJ, STOP): what verify's metadata check accepts
DCP_METADATA = b"ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81."


def _metadata():
    """512 bytes of a .metadata that checks out, random after its STOP (never read): each one's sha256 differs."""
    return DCP_METADATA + os.urandom(512 - len(DCP_METADATA))


def _checkpoint(workdir, step, identity, shards=2):
    """A published checkpoint folder as checkpoint.save leaves it (random shard bytes, a manifest)."""
    folder = Path(workdir) / "checkpoints" / step_name(step)
    folder.mkdir(parents=True)
    for r in range(shards):
        (folder / f"__{r}_0.distcp").write_bytes(os.urandom(8192))
    (folder / ".metadata").write_bytes(_metadata())
    files = {p.name: file_sum(p) for p in folder.iterdir()}
    manifest = Manifest(
        step=step, model=fingerprint(identity), model_identity=identity, layouts={}, data="d", files=files
    )
    (folder / MANIFEST).write_text(manifest.model_dump_json())
    (folder.parent / "latest").write_text(step_name(step) + "\n")
    return folder


def _choose(workdir, identity):
    lines = []
    chosen = choose_checkpoint(workdir, identity, tell=lines.append)
    return (None if chosen is None else chosen.step), lines


# -- the fingerprint ----------------------------------------------------------------------------------------


def test_the_fingerprint_covers_the_model_not_its_layout_or_what_a_run_may_change():
    base = _plan()
    same = model_identity(_plan(llm=Layout(tp=2)).model)
    assert fingerprint(model_identity(base.model)) == fingerprint(same)  # TP instead of DP: the same model
    frozen = dict(base.model.modules)
    frozen["vision"] = frozen["vision"].model_copy(update={"trainable": False})
    assert fingerprint(model_identity(base.model.model_copy(update={"modules": frozen}))) == fingerprint(same)
    other = model_identity(_plan(layers=1).model)
    assert fingerprint(other) != fingerprint(same)
    assert differences(same, other) == ["modules.llm.layers: 2 then, 1 now"]
    assert fingerprint(model_identity(base.model, "pkg.mod:build")) != fingerprint(same)  # a user's factory


# -- choosing the checkpoint ------------------------------------------------------------------------------


def test_the_newest_intact_checkpoint_is_chosen_and_each_skipped_one_said(tmp_path):
    ident = model_identity(_plan().model)
    for step in (10, 20, 30, 40, 50):
        _checkpoint(tmp_path, step, ident)
    root = tmp_path / "checkpoints"
    with open(root / step_name(50) / "__1_0.distcp", "r+b") as f:  # 4 KB of flipped bytes
        f.seek(1024)
        data = f.read(4096)
        f.seek(1024)
        f.write(bytes(b ^ 0xFF for b in data))
    with open(root / step_name(40) / "__0_0.distcp", "r+b") as f:
        f.truncate(100)
    (root / step_name(30) / "__1_0.distcp").unlink()
    (root / step_name(20) / ".metadata").write_bytes(_metadata())  # another .metadata, same size
    assert _choose(tmp_path, ident) == (
        10,
        [
            "skipping step_00000050: shard __1_0.distcp: checksum mismatch",
            "skipping step_00000040: shard __0_0.distcp: 100 bytes, 8192 written (truncated or replaced)",
            "skipping step_00000030: shard __1_0.distcp: missing",
            "skipping step_00000020: metadata .metadata: checksum mismatch",
        ],
    )


@pytest.mark.parametrize(
    "latest, said",
    [
        ("\x00\xffgarbage", "'\\x00\\ufffdgarbage' is not a step folder's name; scanning the step folders"),
        ("step_00000040", "names step_00000040, which is missing; scanning the step folders"),
        (None, "missing; scanning the step folders"),
    ],
)
def test_a_bad_latest_falls_back_to_the_step_folders(tmp_path, latest, said):
    ident = model_identity(_plan().model)
    _checkpoint(tmp_path, 10, ident)
    _checkpoint(tmp_path, 20, ident)
    path = tmp_path / "checkpoints" / "latest"
    if latest is None:
        path.unlink()
    else:
        path.write_bytes(latest.encode("latin-1"))
    assert _choose(tmp_path, ident) == (20, [f"{path}: {said}"])


def test_no_checkpoint_is_none_and_none_verifying_is_refused_not_a_restart(tmp_path):
    ident = model_identity(_plan().model)
    assert _choose(tmp_path, ident) == (None, [])
    (tmp_path / "checkpoints" / "step_00000010.tmp").mkdir(parents=True)  # an interrupted save: never a candidate
    assert _choose(tmp_path, ident) == (None, [])
    (_checkpoint(tmp_path, 20, ident) / MANIFEST).write_text("{")
    with pytest.raises(RunMismatch, match=r"checkpoints: none of its 1 checkpoint\(s\) verifies .* --no-resume"):
        choose_checkpoint(tmp_path, ident, tell=lambda line: None)


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path):
    _checkpoint(tmp_path, 10, model_identity(_plan(layers=1).model))
    with pytest.raises(RunMismatch) as err:
        choose_checkpoint(tmp_path, model_identity(_plan().model), tell=lambda line: None)
    assert str(err.value) == (
        f"{tmp_path / 'checkpoints' / step_name(10)}: a checkpoint of another model (modules.llm.layers: 1 then, "
        "2 now): launch with --no-resume to start over (the old run is moved aside) or choose another --workdir"
    )


def test_verify_names_a_missing_manifest_and_a_manifest_without_metadata(tmp_path):
    folder = _checkpoint(tmp_path, 10, {"modules": {}})
    manifest = json.loads((folder / MANIFEST).read_text())
    del manifest["files"][".metadata"]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert verify(folder) == "manifest.json: lists no .metadata"
    (folder / MANIFEST).unlink()
    assert verify(folder) == "no manifest.json"


# -- the workdir's plan, --no-resume ----------------------------------------------------------------------


def test_another_model_in_the_workdir_is_refused_a_new_layout_said(tmp_path, capsys):
    plan = _plan()
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    tp = _plan(llm=Layout(tp=2))
    check_same_model(tmp_path, tp, model_identity(tp.model), None)
    assert capsys.readouterr().err.strip() == (
        "orch: the same model on a new layout (audio dp2 ranks 0-1 -> tp2 dp1 ranks 0-1; llm dp2 ranks 0-1 -> tp2 dp1 "
        "ranks 0-1): checkpoints are re-sharded on load"
    )
    small = _plan(layers=1)
    with pytest.raises(RunMismatch, match=r"holds a run of another model \(modules.llm.layers: 2 then, 1 now\): "):
        check_same_model(tmp_path, small, model_identity(small.model), None)


def test_no_resume_moves_the_previous_run_aside_before_anything_is_written(tmp_path, capsys):
    plan = _plan()
    _checkpoint(tmp_path, 10, model_identity(plan.model))
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    (tmp_path / "plan.json").write_text(_plan(layers=1).model_dump_json())  # another model: --no-resume allows it
    opened = open_run(tmp_path, plan, resume=False, factory=None, checkpoint_needs=0)
    opened.lock.release()
    (moved,) = tmp_path.glob("previous-*")
    assert opened.start == 0
    assert capsys.readouterr().err.strip() == f"orch: --no-resume: the previous run's files moved to {moved}"
    assert sorted(p.name for p in moved.iterdir()) == ["checkpoints", "metrics.jsonl", "plan.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [moved.name, "run.lock"]
    assert move_aside(tmp_path) is None  # nothing left to move
    # A crash of the new run before its first checkpoint: the next plain launch starts at 0, not at step 10.
    again = open_run(tmp_path, plan, resume=True, factory=None, checkpoint_needs=0)
    again.lock.release()
    assert again.start == 0


def test_a_resumed_launch_resumes_and_says_from_where(tmp_path, capsys):
    plan = _plan()
    _checkpoint(tmp_path, 10, model_identity(plan.model))
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    opened = open_run(tmp_path, plan, resume=True, factory=None, checkpoint_needs=0)
    opened.lock.release()
    assert opened.start == 10
    assert capsys.readouterr().err.strip() == ""  # the ranks say it once they verified the checksums together
    other_data = plan.data.model_copy(update={"global_batch": 8})  # the checkpoint's manifest says data "d"
    opened = open_run(tmp_path, plan, resume=True, factory=None, checkpoint_needs=0, data=other_data)
    opened.lock.release()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "orch: the data spec changed since step_00000010: continuing on this one"
    )


# -- the lock ---------------------------------------------------------------------------------------------

HOLD = """
import sys, time
from orch.runtime.workdir.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def _holder_process(workdir, env=None):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(workdir)], stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_launch_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(tmp_path):
    proc = _holder_process(tmp_path)
    try:
        holder = read_holder(lock_path(tmp_path))
        assert holder is not None and holder.pid == proc.pid and holder.job_id == "local"
        with pytest.raises(RunLocked) as err:
            RunLock(tmp_path).acquire()
        assert str(err.value) == (
            f"{tmp_path}: in use by {holder.describe()} ({lock_path(tmp_path)}); wait for it to end, stop it, or "
            "choose another --workdir"
        )
        assert f"in use by pid {proc.pid} on " in str(err.value)
        with pytest.raises(RunLocked):
            probe(tmp_path)  # what `orch launch --executor slurm|torchrun` checks before submitting
        plan = _plan()
        with pytest.raises(RunLocked):  # refused before anything in the workdir changes
            open_run(tmp_path, plan, resume=False, factory=None, checkpoint_needs=0)
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: the kernel frees the flock, the file still names the dead pid
        proc.wait()
    probe(tmp_path)
    lock = RunLock(tmp_path)
    lock.acquire()
    assert lock.notes == [f"{lock_path(tmp_path)}: stale lock of {holder.describe()}, which is gone: taken over"]
    assert read_holder(lock_path(tmp_path)).pid == os.getpid()
    lock.release()
    assert lock_path(tmp_path).read_text() == ""  # a clean end leaves no holder behind
    again = RunLock(tmp_path)
    again.acquire()
    assert again.notes == []
    again.release()


def test_a_requeued_job_takes_the_lock_of_its_previous_incarnation(tmp_path, monkeypatch):
    before = Holder("node1", 99999999, "4242", 0, time.time() - 60)
    lock_path(tmp_path).write_text(json.dumps(before.__dict__))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    lock = RunLock(tmp_path)
    lock.acquire()
    assert lock.notes == [f"{lock_path(tmp_path)}: taken over from job 4242's previous incarnation (requeued)"]
    lock.release()
    # Still held by that incarnation (a lease outliving it): waited for, then refused if it never lets go.
    proc = _holder_process(tmp_path, {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0"})
    try:
        t0 = time.monotonic()
        with pytest.raises(RunLocked, match="job 4242"):
            RunLock(tmp_path, requeue_wait_s=0.5, poll_s=0.1).acquire()
        assert time.monotonic() - t0 >= 0.5
        monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # the same incarnation twice: refused at once
        t0 = time.monotonic()
        with pytest.raises(RunLocked):
            RunLock(tmp_path, requeue_wait_s=30).acquire()
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()
        proc.wait()


# -- a full disk ------------------------------------------------------------------------------------------


def test_a_full_disk_is_the_same_one_line_while_writing_and_at_relaunch(tmp_path, monkeypatch):
    import orch.runtime.workdir.disk as disk

    monkeypatch.setattr(disk, "free_bytes", lambda path: 1234)
    where = tmp_path / "checkpoints"
    with pytest.raises(NoSpaceError) as during, no_space_guard(where, 5_000_000, "a checkpoint"):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(NoSpaceError) as relaunch:
        check_free(where, 5_000_000, "a checkpoint")
    assert (
        str(during.value)
        == str(relaunch.value)
        == (f"{where}: no space left on device: a checkpoint needs about 4.8 MB (5000000 bytes), 1.2 KB free")
    )
    with pytest.raises(NoSpaceError):  # open_run checks before it takes the lock or moves anything
        open_run(tmp_path, _plan(), resume=True, factory=None, checkpoint_needs=5_000_000)
    assert not lock_path(tmp_path).exists()
    # torch's zip writer's short write, seen after another rank's discarded .tmp gave some space back: still less
    # free than the checkpoint needs, so a full disk's line, not a traceback
    monkeypatch.setattr(disk, "free_bytes", lambda path: 2_000_000)
    with pytest.raises(NoSpaceError), no_space_guard(where, 5_000_000, "a checkpoint"):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(disk, "free_bytes", lambda path: 10**12)
    with pytest.raises(ValueError), no_space_guard(where, 5_000_000, "a checkpoint"):  # not a full disk
        raise ValueError("a bug")


def test_without_flock_the_file_names_the_holder(tmp_path, monkeypatch, capsys):
    import fcntl

    import orch.runtime.workdir.run_lock as run_lock

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_flock)
    assert fcntl.flock is no_flock
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = Holder(os.uname().nodename, sleeper.pid, "local", 0, time.time())
        lock_path(tmp_path).write_text(json.dumps(alive.__dict__))
        with pytest.raises(RunLocked, match=f"in use by pid {sleeper.pid} on "):
            RunLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    lock = RunLock(tmp_path)
    lock.acquire()  # its holder is gone: taken, saying it is guarded by the file's words only
    assert "cannot lock (No locks available): guarded by its words only" in capsys.readouterr().err
    assert lock.notes == [f"{lock_path(tmp_path)}: stale lock of {alive.describe()}, which is gone: taken over"]
    lock.release()


# -- the ranks verify the checksums together (runtime/workdir/checkpoint_agree.py) -------------------------------------


def test_the_ranks_share_the_files_to_hash_by_bytes():
    from orch.runtime.workdir.checkpoint_manifest import FileSum, share_of

    sizes = {"a": 900, "b": 500, "c": 400, "d": 300, "e": 100, ".metadata": 10}
    manifest = Manifest(
        step=1, model="m", model_identity={}, layouts={}, data="d",
        files={n: FileSum(bytes=b, sha256="") for n, b in sizes.items()},
    )  # fmt: skip
    shares = [share_of(manifest, r, 3) for r in range(3)]
    assert sorted(n for s in shares for n in s) == sorted(sizes)  # each file hashed once
    assert [sum(sizes[n] for n in s) for s in shares] == [900, 610, 700]  # largest first, each to the lightest rank
    assert share_of(manifest, 0, 1) == ["a", "b", "c", "d", "e", ".metadata"]


def _one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)


def test_a_launch_checks_sizes_and_the_ranks_fall_back_past_a_checksum_mismatch(tmp_path, capsys):
    """What the launch accepts before the rendezvous (sizes intact), the ranks reject once they hash it: they skip
    to the older checkpoint, say so, and trim the metrics back to it."""
    import torch.distributed as dist

    from orch.runtime.workdir.checkpoint_agree import agree_checkpoint

    plan = _plan()
    ident = model_identity(plan.model)
    for step in (10, 20):
        _checkpoint(tmp_path, step, ident)
    (tmp_path / "checkpoints" / step_name(20) / "__1_0.distcp").write_bytes(os.urandom(8192))  # same size
    records = [json.dumps({"step": k, "loss": 1.0}) for k in range(20)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(records) + "\n")
    opened = open_run(tmp_path, plan, resume=True, factory=None, checkpoint_needs=0)
    opened.lock.release()
    assert opened.start == 20  # the launch saw nothing wrong: sizes only
    _one_rank_group(tmp_path)
    try:
        assert agree_checkpoint(tmp_path, 20, ident, 0, 1) == 10
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            "orch: skipping step_00000020: shard __1_0.distcp: checksum mismatch",
            "orch: resuming from step_00000010 (verified)",
        ]
        kept = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert kept == list(range(10))
        assert agree_checkpoint(tmp_path, 10, ident, 0, 1) == 10
        other = model_identity(_plan(layers=1).model)
        (tmp_path / "checkpoints" / step_name(10) / ".metadata").write_bytes(_metadata())
        with pytest.raises(RunMismatch, match=r"none of its 2 checkpoint\(s\) verifies"):  # step 20: said above
            agree_checkpoint(tmp_path, 10, other, 0, 1)
    finally:
        dist.destroy_process_group()


def test_the_ranks_take_a_checkpoint_without_a_manifest_only_when_none_verifies(tmp_path, capsys):
    """A newer folder saved without a manifest (unverifiable) is passed over for a verified one; once the ranks find
    every verified one damaged, it is what they resume from, each said in one line."""
    import torch.distributed as dist

    from orch.runtime.workdir.checkpoint_agree import agree_checkpoint

    plan = _plan()
    ident = model_identity(plan.model)
    for step in (10, 20, 30):
        _checkpoint(tmp_path, step, ident)
    (tmp_path / "checkpoints" / step_name(30) / MANIFEST).unlink()
    (tmp_path / "checkpoints" / step_name(20) / "__1_0.distcp").write_bytes(os.urandom(8192))  # same size
    opened = open_run(tmp_path, plan, resume=True, factory=None, checkpoint_needs=0)
    opened.lock.release()
    assert opened.start == 20
    assert capsys.readouterr().err.splitlines() == [
        "orch: passing over step_00000030: saved without a manifest, it cannot be verified; step_00000020 can"
    ]
    _one_rank_group(tmp_path)
    try:
        assert agree_checkpoint(tmp_path, 20, ident, 0, 1) == 10
        assert capsys.readouterr().err.splitlines() == [
            "orch: skipping step_00000020: shard __1_0.distcp: checksum mismatch",
            "orch: resuming from step_00000010 (verified)",
        ]
        (tmp_path / "checkpoints" / step_name(10) / "__0_0.distcp").write_bytes(os.urandom(8192))
        assert agree_checkpoint(tmp_path, 20, ident, 0, 1) == 30
        assert capsys.readouterr().err.splitlines() == [
            "orch: skipping step_00000020: shard __1_0.distcp: checksum mismatch",
            "orch: skipping step_00000010: shard __0_0.distcp: checksum mismatch",
            "orch: step_00000030: saved without a manifest (an older orch) and no checkpoint verifies: loaded "
            "unverified",
        ]
    finally:
        dist.destroy_process_group()


def test_pruning_keeps_the_newest_and_clears_a_crashed_delete(tmp_path):
    from orch.runtime.workdir.run_dir import TRASH, checkpoint_root, prune_checkpoints

    ident = model_identity(_plan().model)
    for step in (1, 2, 3, 4):
        _checkpoint(tmp_path, step, ident)
    root = checkpoint_root(tmp_path)
    (root / f"{TRASH}step_00000000").mkdir()  # a delete a crash interrupted
    assert prune_checkpoints(tmp_path, 0) == []  # keep all: only the leftover goes
    assert sorted(p.name for p in root.iterdir()) == ["latest", *(step_name(k) for k in (1, 2, 3, 4))]
    assert prune_checkpoints(tmp_path, 2) == [step_name(2), step_name(1)]
    assert sorted(p.name for p in root.iterdir()) == ["latest", step_name(3), step_name(4)]
    assert _choose(tmp_path, ident) == (4, [])
