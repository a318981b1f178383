"""Nothing a run loads from its workdir can run code: a crafted checkpoint `.metadata` (its manifest's hash
recomputed, or the manifest deleted), a non-tensor entry holding a pickle, a crafted task file."""

import os
import pickle
from pathlib import Path

import pytest

from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.workdir.checkpoint_manifest import MANIFEST, Manifest, file_sum
from orch.runtime.workdir.checkpoint_metadata import _DTYPES, metadata_problem
from orch.runtime.workdir.run_dir import RunMismatch, choose_checkpoint, open_run, step_name
from orch.runtime.workdir.run_identity import fingerprint, model_identity


class _Payload:
    """Pickles as a call that writes `marker`: what an attacker puts in a file a run unpickles."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _plan():
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 64})
    return hand_plan(model, data, {"llm": (Layout(dp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})


def _save(folder: Path, state) -> None:
    import torch.distributed.checkpoint as dcp

    with pytest.warns(UserWarning, match="single process"):
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    if folder.parent.name == "checkpoints":
        (folder.parent / "latest").write_text(folder.name + "\n")  # as checkpoint.save publishes it


def _manifest(folder: Path, identity, step: int) -> None:
    """The manifest checkpoint.save writes, its hashes computed over whatever the folder holds now."""
    files = {p.name: file_sum(p) for p in folder.iterdir() if p.name != MANIFEST}
    manifest = Manifest(
        step=step, model=fingerprint(identity), model_identity=identity, layouts={}, data="d", files=files
    )
    (folder / MANIFEST).write_text(manifest.model_dump_json())


def _tensors():
    import torch

    return {"llm": {"model": {"w": torch.arange(6, dtype=torch.float64)}, "optim": {}}}


def test_the_dtypes_allowed_are_torchs():
    import torch

    assert {n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)} == _DTYPES


def test_dcp_metadata_checks_out_and_loads_through_the_restricted_reader(tmp_path):
    import torch

    from orch.runtime.workdir.checkpoint_metadata import read_whole

    state = _tensors()
    state["llm"]["optim"] = {"w": {"step": torch.tensor(3.0), "count": 7, "name": "adamw"}}  # non-tensor entries
    state["llm"]["model"]["h"] = torch.ones(2, 3, dtype=torch.bfloat16)
    _save(tmp_path / "ck", state)
    assert metadata_problem(tmp_path / "ck" / ".metadata") is None
    back = read_whole(tmp_path / "ck")
    assert torch.equal(back["llm"]["model"]["w"], state["llm"]["model"]["w"])
    assert torch.equal(back["llm"]["model"]["h"], state["llm"]["model"]["h"])
    assert back["llm"]["optim"]["w"]["count"] == 7 and back["llm"]["optim"]["w"]["name"] == "adamw"


@pytest.mark.parametrize("manifest", ["recomputed", "deleted"])
def test_a_crafted_metadata_runs_nothing_and_the_launch_refuses_in_one_line(tmp_path, manifest, capsys):
    plan = _plan()
    identity = model_identity(plan.model)
    folder = tmp_path / "checkpoints" / step_name(2)
    _save(folder, _tensors())
    marker = tmp_path / "marker"
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    if manifest == "recomputed":
        _manifest(folder, identity, 2)  # an unkeyed sha256: anyone who writes the folder recomputes it
    with pytest.raises(RunMismatch, match=r"none of its 1 checkpoint\(s\) verifies"):
        open_run(tmp_path, plan, resume=True, factory=None, checkpoint_needs=0)
    assert capsys.readouterr().err.splitlines() == [
        "orch: skipping step_00000002: metadata .metadata: names builtins.exec, which DCP's metadata never holds "
        "(not loaded: it could run code)"
    ]
    assert not marker.exists()


def test_the_ranks_load_no_crafted_metadata_that_slipped_past_the_launch(tmp_path):
    """Replaced between the launch's check and the ranks' load: the load itself refuses it."""
    from torch import nn

    from orch.runtime.workdir.checkpoint import load

    folder = tmp_path / "checkpoints" / step_name(2)
    _save(folder, {"llm": {"model": {"weight": __import__("torch").zeros(2, 2, dtype=__import__("torch").float64)}}})
    marker = tmp_path / "marker"
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(BaseException, match="builtins.exec"):  # DCP wraps a rank's error in CheckpointException
        load(tmp_path, 2, {"llm": nn.Linear(2, 2, bias=False).double()}, None)
    assert not marker.exists()


def test_a_non_tensor_entry_holding_a_pickle_runs_nothing(tmp_path):
    """DCP saves a non-tensor value with torch.save and loads it with weights_only=False; orch's planner does not."""
    import torch.distributed.checkpoint as dcp

    from orch.runtime.workdir.checkpoint_metadata import load_planner, reader

    marker = tmp_path / "marker"
    _save(tmp_path / "ck", {"llm": {"extra": _Payload(marker)}})  # pickling runs nothing; unpickling would
    assert metadata_problem(tmp_path / "ck" / ".metadata") is None  # the metadata itself is DCP's own
    with pytest.raises(BaseException, match="Weights only load failed"), pytest.warns(UserWarning):
        dcp.load({"llm": {"extra": None}}, storage_reader=reader(tmp_path / "ck"), planner=load_planner())
    assert not marker.exists()


def test_a_checkpoint_without_a_manifest_is_taken_only_when_none_verifies(tmp_path):
    plan = _plan()
    identity = model_identity(plan.model)
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        _save(root / step_name(step), _tensors())
        _manifest(root / step_name(step), identity, step)
    (root / step_name(3) / MANIFEST).unlink()  # an older orch's, or a manifest deleted: unverifiable

    def choose():
        lines = []
        chosen = choose_checkpoint(tmp_path, identity, tell=lines.append)
        return chosen.step, chosen.manifest is not None, lines

    assert choose() == (
        2,
        True,
        ["passing over step_00000003: saved without a manifest, it cannot be verified; step_00000002 can"],
    )
    for step in (1, 2):  # a shard flipped in each verified one: the unverified one is all there is
        with open(root / step_name(step) / "__0_0.distcp", "r+b") as f:
            f.truncate(10)
    assert choose() == (
        3,
        False,
        [
            "skipping step_00000002: shard __0_0.distcp: 10 bytes, "
            + _shard_bytes(root)
            + " written (truncated or replaced)",
            "skipping step_00000001: shard __0_0.distcp: 10 bytes, "
            + _shard_bytes(root)
            + " written (truncated or replaced)",
            "step_00000003: saved without a manifest (an older orch) and no checkpoint verifies: loaded unverified",
        ],
    )


def _shard_bytes(root: Path) -> str:
    return str(os.path.getsize(root / step_name(3) / "__0_0.distcp"))


# -- files opened in place: never through a link ---------------------------------------------------------------


def _outside(tmp_path: Path) -> Path:
    precious = tmp_path / "outside" / "precious.txt"
    precious.parent.mkdir()
    precious.write_text("keep me\n")
    return precious


def test_a_run_lock_that_is_a_link_is_refused_in_one_line_and_its_target_kept(tmp_path, capsys):
    from orch.runtime.workdir.files import LinkRefused
    from orch.runtime.workdir.run_lock import RunLock, probe

    precious = _outside(tmp_path)
    work = tmp_path / "run"
    work.mkdir()
    (work / "run.lock").symlink_to(precious)
    want = f"{work / 'run.lock'}: a symbolic link, where orch keeps its own file: not followed (remove the link)"
    with pytest.raises(LinkRefused) as info:
        RunLock(work).acquire()
    assert str(info.value) == want
    with pytest.raises(LinkRefused):
        probe(work)
    with pytest.raises(LinkRefused):
        open_run(work, _plan(), resume=True, factory=None, checkpoint_needs=0)
    assert precious.read_text() == "keep me\n"


def test_heartbeats_metrics_and_data_problems_are_never_written_through_a_link(tmp_path):
    from orch.runtime.data.problems import DataProblems
    from orch.runtime.launch.heartbeat import Heartbeat, heartbeat_dir
    from orch.runtime.workdir.files import LinkRefused
    from orch.runtime.workdir.metrics import StepRecord, append_record, metrics_path

    precious = _outside(tmp_path)
    heartbeat_dir(tmp_path).mkdir()
    (heartbeat_dir(tmp_path) / "rank0.json").symlink_to(precious)
    with pytest.raises(LinkRefused):
        Heartbeat(tmp_path, 0)
    metrics_path(tmp_path).symlink_to(precious)
    with pytest.raises(LinkRefused):
        append_record(metrics_path(tmp_path), StepRecord(step=0, loss=1.0, tokens=7, step_time_s=0.5, ranks={}))
    (tmp_path / "problems.jsonl").symlink_to(precious)
    with pytest.raises(LinkRefused):
        DataProblems(str(tmp_path / "problems.jsonl")).add("a.jsonl:3", "image", "bad", 0, "skipped")
    assert precious.read_text() == "keep me\n"


# -- the workdir: private, and one line when it cannot be written ----------------------------------------------


def test_a_workdir_others_can_write_is_said_in_one_line(tmp_path, capsys):
    work = tmp_path / "shared"
    work.mkdir()
    work.chmod(0o775)
    opened = open_run(work, _plan(), resume=True, factory=None, checkpoint_needs=0)
    opened.lock.release()
    assert capsys.readouterr().err.splitlines() == [
        f"orch: {work}: its group or others can write it, and could plant files the run loads: chmod go-w {work}"
    ]


def test_a_workdir_is_created_private_whatever_the_umask_unless_asked(tmp_path, monkeypatch):
    import stat

    from orch.planner.errors import OrchError
    from orch.runtime.workdir.files import make_workdir

    old = os.umask(0o002)
    try:
        opened = open_run(tmp_path / "run", _plan(), resume=True, factory=None, checkpoint_needs=0)
        opened.lock.release()
        assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700
        monkeypatch.setenv("ORCH_WORKDIR_MODE", "0750")
        assert stat.S_IMODE(make_workdir(tmp_path / "shared").stat().st_mode) == 0o750
        for bad in ("rwx", "0770", "0500"):
            monkeypatch.setenv("ORCH_WORKDIR_MODE", bad)
            with pytest.raises(
                OrchError, match=rf"^ORCH_WORKDIR_MODE={bad}: expected an octal mode that lets its owner"
            ):
                make_workdir(tmp_path / "other")
        assert not (tmp_path / "other").exists()
    finally:
        os.umask(old)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot write: a read-only bind mount for root (who ignores modes), else 0555."""
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
    if not mounted or subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True).returncode:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)
        pytest.skip("root without mount: no directory it cannot write")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_workdir_is_one_line_naming_it(cli, plan_file, read_only_dir):
    path, _, _ = plan_file
    result = cli("launch", str(path), "--nproc", "2", "--steps", "1", "--workdir", str(read_only_dir))
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"error: {read_only_dir}: the workdir is not writable: a run writes its lock, checkpoints and metrics there; "
        "make it writable or choose another --workdir"
    )
    assert "Traceback" not in result.output
