"""A data file edited after `orch plan`: the launch is refused before any rank starts, for every executor, in one
line naming the file, what changed and what to do; and a re-planned index the checkpoint did not draw from is
refused at launch too, not by rank 0 after a line saying the run continues."""

import json
import os
from pathlib import Path

import pytest
import yaml

from orch.cli.data_cmd import conversation_data
from orch.planner.plan import Layout
from orch.runtime.data.demo_data import make_dataset, make_tokenizer
from orch.runtime.data.freshness import check_index_current
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.workdir.checkpoint_manifest import MANIFEST, Manifest, file_sum
from orch.runtime.workdir.run_dir import step_name
from orch.runtime.workdir.run_identity import fingerprint, model_identity

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

EXECUTORS = ("local", "torchrun", "slurm")


@pytest.fixture
def planned(tmp_path):
    """A data file, its index and a plan on it (as `orch plan --data data.jsonl` writes it)."""
    data = make_dataset(tmp_path / "users", images=3, tones=1)
    tok = make_tokenizer(tmp_path / "tok" / "tokenizer.json")
    model = load_model("tiny")
    spec, _ = conversation_data(model, str(data), 4, None, str(tok))
    plan = hand_plan(model, spec, {"llm": (Layout(dp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan.model_dump(mode="json")))
    return data, path, plan


def _launch(cli, plan_path, workdir, *extra):
    return cli("launch", str(plan_path), "--workdir", str(workdir), "--steps", "2", *extra)


def _later(path: Path, seconds: int = 5) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 10**9))


def test_rows_appended_after_planning_refuse_the_launch_for_every_executor(cli, planned, tmp_path):
    data, plan_path, _ = planned
    for executor in EXECUTORS:
        r = _launch(cli, plan_path, tmp_path / executor, "--executor", executor, "--dry-run")
        assert r.exit_code == 0, r.output
    before = data.stat().st_size
    first = data.read_text().splitlines()[0]
    with data.open("a") as f:
        f.write(first + "\n")  # a row appended: the index would never draw it
    after = data.stat().st_size
    for executor in EXECUTORS:
        r = _launch(cli, plan_path, tmp_path / f"{executor}-edited", "--executor", executor, "--dry-run")
        assert r.exit_code == 1, r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.output
        assert lines[0].startswith(
            f"error: {data.resolve()}: changed since it was indexed for {plan_path} (size {before} -> {after} bytes, "
            "modified "
        )
        assert lines[0].endswith("): re-run `orch plan` (or `orch data index`) on it and launch the new plan")
        assert not (tmp_path / f"{executor}-edited" / "task.pkl").exists()  # nothing started, nothing written


def test_an_answer_edited_in_place_is_a_change_too(cli, planned, tmp_path):
    data, plan_path, _ = planned
    text = data.read_text()
    i = text.index('"assistant"')
    edited = text[:i] + text[i:].replace("a", "e", 1)  # the same size: an answer's word changed
    assert len(edited) == len(text) and edited != text
    data.write_text(edited)
    _later(data)
    r = _launch(cli, plan_path, tmp_path / "run", "--dry-run")
    assert r.exit_code == 1
    assert "(indexed as of " in r.stderr and "), same size): re-run `orch plan`" in r.stderr


def test_an_index_summary_without_keys_is_checked_by_time(planned):
    data, _, plan = planned
    summary = Path(plan.data.manifest).with_suffix(".json")
    meta = json.loads(summary.read_text())
    assert [s["key"].rsplit(":", 2)[1] for s in meta["sources"]] == [str(data.stat().st_size)]
    for s in meta["sources"]:
        del s["key"]
    summary.write_text(json.dumps(meta))
    check_index_current(plan.data, "plan.yaml")  # untouched since indexed: nothing to say
    _later(data)
    with pytest.raises(Exception, match=r"changed since it was indexed for plan.yaml \(modified .*, after its index"):
        check_index_current(plan.data, "plan.yaml")


# DCP's Metadata, empty, as a pickle (GLOBAL, EMPTY_TUPLE, NEWOBJ, STOP)
DCP_METADATA = b"ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81."


def _checkpoint(workdir: Path, step: int, plan, index: str) -> None:
    """A published checkpoint as checkpoint.save leaves it, whose sampler drew from `index`."""
    folder = workdir / "checkpoints" / step_name(step)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(os.urandom(1024))
    (folder / ".metadata").write_bytes(DCP_METADATA)  # an empty DCP Metadata: what a launch's check accepts
    (folder / "data.json").write_text(json.dumps({"index": index, "epoch": 0, "position": 8}))
    identity = model_identity(plan.model)
    files = {p.name: file_sum(p) for p in folder.iterdir()}
    manifest = Manifest(step=step, model=fingerprint(identity), model_identity=identity, layouts={}, data="d",
                        files=files)  # fmt: skip
    (folder / MANIFEST).write_text(manifest.model_dump_json())
    (folder.parent / "latest").write_text(step_name(step) + "\n")


def test_a_replanned_index_the_checkpoint_did_not_draw_from_is_refused_before_any_rank(cli, planned, tmp_path):
    _, plan_path, plan = planned
    run = tmp_path / "run"
    old = plan.data.manifest.replace(".jsonl", "-before.jsonl")
    _checkpoint(run, 2, plan, old)
    r = _launch(cli, plan_path, run, "--steps", "4")
    assert r.exit_code == 1, r.output
    assert r.stderr.strip().splitlines() == [
        f"error: {run / 'checkpoints' / step_name(2) / 'data.json'}: the checkpoint drew its batches from {old}; the "
        f"data now indexes as {plan.data.manifest} (the data file, its tokenizer or the model changed): resume in a "
        "fresh workdir, or --no-resume"
    ]
    assert "launching" not in r.output and not (run / "metrics.jsonl").exists()
