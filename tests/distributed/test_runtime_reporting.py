"""`--report-to`: what rank 0 logged, read back with each backend's own reader, equals metrics.jsonl's records."""

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from launching import train_local

from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.reporting import step_scalars
from orch.runtime.train.config import TrainConfig

pytestmark = pytest.mark.slow
INSTALLED = [name for name, module in (("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow"))
             if importlib.util.find_spec(module) is not None]  # fmt: skip


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """One 2-rank run logging to every installed backend; (workdir, its StepRecords)."""
    if not INSTALLED:
        pytest.skip("no reporting backend installed (pip install 'orch[report]')")
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 32})
    plan = hand_plan(model, data, {"llm": (Layout(tp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})
    workdir = tmp_path_factory.mktemp("reported")
    cfg = TrainConfig(steps=3, dtype="float64", device="cpu", report_to=INSTALLED)
    records = train_local(plan, data, cfg, workdir)
    assert [r.step for r in records] == [0, 1, 2]
    return workdir, records


def test_tensorboard_events_hold_each_step_scalars(reported):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    workdir, records = reported
    events = EventAccumulator(str(workdir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    want = [step_scalars(r) for r in records]
    assert set(events.Tags()["scalars"]) == set(want[0])
    assert {"train/loss", "train/lr", "train/grad_norm", "time/step_s", "memory/peak_gib"} <= set(want[0])
    assert any(k.startswith("imbalance/") for k in want[0]) and any(k.startswith("time/llm") for k in want[0])
    for tag in want[0]:
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        assert logged == [(r.step, float(np.float32(w[tag]))) for r, w in zip(records, want, strict=True)], tag
    assert [e.value for e in events.Scalars("train/loss")] == [float(np.float32(r.loss)) for r in records]


def _wandb_records(path: Path):
    """The protobuf records of a W&B transaction log (.wandb: a LevelDB-style log of 32 KiB blocks, each
    chunk `crc32 | length | type`), parsed with wandb's own Record message."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_offline_run_holds_each_step_scalars(reported):
    pytest.importorskip("wandb")
    workdir, records = reported
    runs = list((workdir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs
    history = {}
    for record in _wandb_records(runs[0]):
        if record.WhichOneof("record_type") == "history":
            row = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            history[row["_step"]] = row
    assert sorted(history) == [0, 1, 2]
    for r in records:
        want = step_scalars(r)
        assert {k: history[r.step][k] for k in want} == want  # JSON round trip: float64 exactly


def test_mlflow_file_store_holds_each_step_scalars(reported, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # reading the run's own file store, as the sink writes it
    from mlflow.tracking import MlflowClient

    workdir, records = reported
    client = MlflowClient(tracking_uri=(workdir / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("orch")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == workdir.name and run.info.status == "FINISHED"
    assert run.data.params["dtype"] == "float64"
    for tag in step_scalars(records[0]):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))
        assert history == [(r.step, step_scalars(r)[tag]) for r in records], tag
