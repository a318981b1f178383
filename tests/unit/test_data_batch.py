"""The batch types (runtime/data/batch.py) and the decode cache a prefetch fills (runtime/data/decode_cache.py):
both batches satisfy the one `GlobalBatch` contract, and a prefetched batch trains on what an unprefetched one
decodes itself, with the same data counts."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from orch.cli.data_cmd import conversation_data
from orch.planner.loading import load_data
from orch.runtime.data.batch import GlobalBatch
from orch.runtime.data.demo_data import make_dataset, make_tokenizer
from orch.runtime.data.prefetch import SamplePrefetcher
from orch.runtime.data.source import BatchSource, ConversationBatch
from orch.runtime.data.synthetic import SyntheticBatch
from orch.runtime.models.registry import load_model

ENCODERS = ("audio", "vision")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch-data")
    data_file = make_dataset(root, images=6, tones=4)
    tok = make_tokenizer(root / "tok" / "tokenizer.json")
    model = load_model("tiny")
    data, _ = conversation_data(model, str(data_file), 8, None, str(tok))
    return root, model, data


def _conversation_batch(model, data, step=0) -> ConversationBatch:
    batch = BatchSource(model, data, seed=1).build(step)
    assert isinstance(batch, ConversationBatch)
    return batch


def test_synthetic_and_conversation_batches_are_global_batches(files):
    _, model, data = files
    synthetic: GlobalBatch = SyntheticBatch.build(load_model("tiny"), load_data("tiny-mix"), seed=0, step=0)
    conversations: GlobalBatch = _conversation_batch(model, data)
    for batch in (synthetic, conversations):
        assert isinstance(batch, GlobalBatch)
        assert batch.size == len(batch.text_tokens) == len(batch.enc_tokens)
        assert batch.layout(0).length == sum(batch.projected(e, 0) for e in ENCODERS) + batch.text_tokens[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        conversations.step = 3  # type: ignore[misc]


def test_the_batch_module_imports_no_torch():
    code = "import sys, orch.runtime.data.batch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_prefetched_batch_trains_on_what_it_would_decode_itself(files):
    _, model, data = files
    prefetched, asked = _conversation_batch(model, data), _conversation_batch(model, data)
    ids = list(range(prefetched.size))
    loader = SamplePrefetcher()
    try:
        loader.start(prefetched, lambda: {e: ids for e in ENCODERS})
        assert loader.wait(prefetched.step) >= 0.0
    finally:
        loader.close()
    assert prefetched.decoded.counts() == {"failed": 0, "decoded": len(ids) * len(ENCODERS)}
    assert asked.decoded.counts() == {"failed": 0, "decoded": 0}
    for i in ids:
        a, b = prefetched.sample(i, torch.float64), asked.sample(i, torch.float64)
        assert a.feats.keys() == b.feats.keys() == set(ENCODERS)
        assert all(torch.equal(a.feats[e], b.feats[e]) for e in ENCODERS)
        assert torch.equal(a.text, b.text) and torch.equal(a.labels, b.labels)
    assert prefetched.data_counts() == asked.data_counts()
    assert prefetched.data_counts()["decoded"] == len(ids) * len(ENCODERS)


@pytest.mark.slow
def test_a_loader_worker_process_fills_the_cache_as_the_thread_does(files):
    _, model, data = files
    by_thread, by_worker = _conversation_batch(model, data, step=1), _conversation_batch(model, data, step=1)
    ids = list(range(by_thread.size))
    for batch, workers in ((by_thread, 0), (by_worker, 1)):
        loader = SamplePrefetcher(workers, (model, data))
        try:
            loader.start(batch, lambda: {e: ids for e in ENCODERS})
            loader.wait(batch.step)
        finally:
            loader.close()
    assert by_worker.data_counts() == by_thread.data_counts()
    assert by_worker.decoded.counts() == {"failed": 0, "decoded": len(ids) * len(ENCODERS)}
    for i in ids:
        a, b = by_thread.sample(i, torch.float64), by_worker.sample(i, torch.float64)
        assert all(torch.equal(a.feats[e], b.feats[e]) for e in ENCODERS)
    assert by_worker.data_counts() == by_thread.data_counts()  # nothing decoded again when asked


def test_unreadable_media_are_zeros_counted_once_per_sample(files):
    _, model, data = files
    batch = _conversation_batch(model, data)
    with_images = [i for i in range(batch.size) if batch.enc_tokens[i]["vision"]]
    assert with_images
    for i in with_images:
        batch.decoded.put(i, ("vision",), None)  # as a worker sends back a sample it could not read
        batch.decoded.put(i, ("vision",), None)  # a second arrival keeps the first and counts nothing more
    assert batch.decoded.counts() == {"failed": len(with_images), "decoded": len(with_images)}
    s = batch.sample(with_images[0], torch.float32, encoders=("vision",))
    assert not s.feats["vision"].any() and s.feats["vision"].shape[0] > 0
    assert batch.data_counts()["failed"] == len(with_images)


@pytest.mark.slow
def test_a_signal_to_the_process_group_leaves_the_loader_workers_to_the_rank(files):
    """Ctrl-C or systemd's stop reaches a rank's loader workers too (one process group): the rank stops at a step
    boundary and closes them; a worker the signal killed would break the pool and fail the rank's next step."""
    import multiprocessing
    import os
    import signal

    _, model, data = files
    loader = SamplePrefetcher(1, (model, data))
    try:
        for step in (1, 2):
            batch = _conversation_batch(model, data, step=step)
            ids = list(range(batch.size))
            loader.start(batch, lambda ids=ids: {e: ids for e in ENCODERS})
            loader.wait(step)
            assert batch.decoded.counts() == {"failed": 0, "decoded": len(ids) * len(ENCODERS)}
            workers = multiprocessing.active_children()
            assert workers
            for worker in workers:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    os.kill(worker.pid, signum)
    finally:
        loader.close()
