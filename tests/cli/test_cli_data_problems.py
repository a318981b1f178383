"""Data as users have it: a mix's sources reported, the index kept where the user can write, media found under
--media-root and named when missing, media gone at a step masked on every rank and listed in
data_problems.jsonl, and the one-line warnings (no assistant turn, a batch larger than the data, an image over
Pillow's decompression limit)."""

import errno
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
import torch
import yaml

from orch.cli.data_cmd import conversation_data
from orch.planner.data import manifest_row_weights, read_manifest
from orch.runtime.data import index as index_module
from orch.runtime.data.demo_data import make_dataset, make_tokenizer
from orch.runtime.data.index import build_index
from orch.runtime.data.mix import Mix
from orch.runtime.data.problems import DataProblems, read_problems
from orch.runtime.data.source import ConversationData
from orch.runtime.models.registry import load_model


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("users-data")
    data = make_dataset(root, images=6, tones=2)
    tok = make_tokenizer(root / "tok" / "tokenizer.json")
    return root, data, tok


def _copy(root: Path, to: Path) -> Path:
    shutil.copytree(root, to, ignore=shutil.ignore_patterns(".orch-index"))
    return to


def _one_line(text: str) -> str:
    """The words of `text` on one line, rich's help panel borders left out (its wrap width depends on the options)."""
    return " ".join(w for w in text.split() if w != "│")


def test_a_mix_reports_each_source_and_the_runtime_draws_by_its_weights(dataset, cli, tmp_path):
    root, data, tok = dataset
    lines = data.read_text().splitlines()
    (root / "few.jsonl").write_text("\n".join(lines[:1]) + "\n")
    (root / "rejected.jsonl").write_text('{"messages": [{"role": "robot", "content": "hi"}]}\nnot json\n')
    mix = root / "mix.yaml"
    mix.write_text(yaml.safe_dump({"strategy": "interleave_over", "sources": [
        {"path": "data.jsonl", "weight": 1}, {"path": "few.jsonl", "weight": 1}, {"path": "rejected.jsonl"}]}))  # fmt: skip
    r = cli("data", "index", str(mix), "--model", "tiny", "--tokenizer", str(tok), "--steps", "10",
            "--global-batch", "8", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    n = len(lines)
    assert [s["samples"] for s in shown["sources"]] == [n, 1, 0]
    assert [d["share"] for d in shown["draws"]] == [0.5, 0.5, 0.0]  # the rejected source takes no share
    assert [d["epochs"] for d in shown["draws"]] == [0.5 * 80 / n, 0.5 * 80 / 1, 0.0]
    assert "warning: rejected.jsonl:1: messages[0].role" in r.stderr
    assert f"sources[2]: {root / 'rejected.jsonl'}: every row was skipped" in _one_line(r.stderr)

    table = cli("data", "index", str(mix), "--model", "tiny", "--tokenizer", str(tok), "--steps", "10",
                "--global-batch", "8")  # fmt: skip
    text = _one_line(table.stderr)
    assert "sources (interleave_over)" in text and "few.jsonl 1 1 50.0% 40.00 0" in text
    assert f"data.jsonl {n} 1 50.0% {40 / n:.2f} 0" in text and "10 steps x 8 samples" in text

    model = load_model("tiny")
    spec, _ = conversation_data(model, str(mix), 8, None, str(tok))
    opened = ConversationData(model, spec)
    want = Mix((n, 1, 0), (1.0, 1.0, 1.0), "interleave_over")
    assert [opened.rows_of_step(3, k) for k in range(5)] == [want.rows(3, k, 8) for k in range(5)]
    weights = manifest_row_weights(spec.manifest)  # the planner's length moments draw rows as the run does
    assert weights is not None and len(weights) == len(read_manifest(spec.manifest)) == n + 1
    assert weights[-1] == 0.5 and sum(weights[:n]) == pytest.approx(0.5)


def _unwritable(folder: Path):
    """Make `folder` read-only for real (a read-only bind mount: root ignores permission bits), or None where
    this machine does not let us mount."""
    try:
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        subprocess.run(["umount", str(folder)], check=False)
        return None
    return folder


def test_a_read_only_mount_indexes_into_the_users_cache(dataset, cli, tmp_path, monkeypatch):
    root, _, tok = dataset
    ro = _copy(root, tmp_path / "ro")
    if _unwritable(ro) is None:
        pytest.skip("no read-only bind mount here (the fault-injected test covers the fallback)")
    try:
        with pytest.raises(OSError) as e:
            (ro / "probe").write_text("")
        assert e.value.errno == errno.EROFS
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        r = cli("data", "index", str(ro / "data.jsonl"), "--model", "tiny", "--tokenizer", str(tok))
        assert r.exit_code == 0 and "Traceback" not in r.output
        assert f"index: {tmp_path / 'cache' / 'orch' / 'index'}" in _one_line(r.output)
        out = tmp_path / "plan.yaml"
        p = cli("plan", "--model", "tiny", "--cluster", "local-cpu", "--data", str(ro / "data.jsonl"), "--tokenizer",
                str(tok), "--global-batch", "4", "--out", str(out))  # fmt: skip
        assert p.exit_code == 0, p.output
        assert Path(yaml.safe_load(out.read_text())["data"]["manifest"]).parent == tmp_path / "cache" / "orch" / "index"
        given = cli("data", "index", str(ro / "data.jsonl"), "--model", "tiny", "--tokenizer", str(tok),
                    "--index-dir", str(ro / "here"))  # fmt: skip
        assert given.exit_code == 1 and "cannot write the index (--index-dir)" in _one_line(given.output)
        assert "Traceback" not in given.output
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_an_unwritable_data_folder_falls_back_to_the_cache(dataset, tmp_path, monkeypatch):
    """The fault injected where the index folder is made (`make_index_dir`'s mkdir): EROFS on the data's folder."""
    root, _, tok = dataset
    copy = _copy(root, tmp_path / "data")
    mkdir = Path.mkdir

    def read_only_beside_the_data(self: Path, *args, **kwargs) -> None:
        if self.parent == copy:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only_beside_the_data)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = load_model("tiny")
    idx = build_index(str(copy / "data.jsonl"), model, str(tok))
    assert Path(idx.manifest).parent == tmp_path / "cache" / "orch" / "index" and not idx.cached
    assert build_index(str(copy / "data.jsonl"), model, str(tok)).cached  # found there the next time
    chosen = build_index(str(copy / "data.jsonl"), model, str(tok), index_dir=str(tmp_path / "mine"))
    assert Path(chosen.manifest).parent == tmp_path / "mine"
    assert read_manifest(chosen.manifest) == read_manifest(idx.manifest)
    monkeypatch.setenv("XDG_CACHE_HOME", str(copy / "cache"))  # read-only too: nowhere left, one line
    with pytest.raises(index_module.SpecError, match="cannot write the index .* pass --index-dir DIR"):
        build_index(str(copy / "data.jsonl"), model, str(tok), max_image_tokens=9)


def test_make_index_dir_says_whether_it_can_write(tmp_path):
    assert index_module.make_index_dir(tmp_path / "a" / "b") and (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("")
    assert not index_module.make_index_dir(tmp_path / "file")  # a file in the way


def test_media_root_and_the_path_tried(dataset, cli, tmp_path):
    root, data, tok = dataset
    media = _copy(root / "media", tmp_path / "store" / "media")
    elsewhere = tmp_path / "text"
    elsewhere.mkdir()
    shutil.copy(data, elsewhere / "data.jsonl")  # its media paths (media/...) are not beside it
    r = cli("data", "index", str(elsewhere / "data.jsonl"), "--model", "tiny", "--tokenizer", str(tok))
    tried = elsewhere / "media" / "img_0000_red_circle.png"
    assert r.exit_code == 0 and f"data.jsonl:1: images[0]: {tried}: file not found" in _one_line(r.stderr)
    found = cli("data", "index", str(elsewhere / "data.jsonl"), "--model", "tiny", "--tokenizer", str(tok),
                "--media-root", str(media.parent))  # fmt: skip
    assert found.exit_code == 0 and "warning" not in found.stderr
    assert read_manifest(build_index(str(data), load_model("tiny"), str(tok)).manifest) == read_manifest(
        build_index(str(elsewhere / "data.jsonl"), load_model("tiny"), str(tok), media_root=str(media.parent)).manifest
    )
    shown = cli("data", "inspect", str(elsewhere / "data.jsonl"), "--model", "tiny", "--tokenizer", str(tok),
                "--media-root", str(media.parent), "--sample", "1", "--json")  # fmt: skip
    assert shown.exit_code == 0 and json.loads(shown.stdout)["encoder_inputs"]["vision"][0] > 0
    bad = cli("data", "index", str(data), "--model", "tiny", "--tokenizer", str(tok), "--media-root", "/nowhere")
    assert bad.exit_code == 1 and "--media-root: /nowhere: not a directory" in bad.output


def test_media_gone_or_cut_at_a_step_mask_the_sample_on_every_rank(dataset, tmp_path):
    root, _, tok = dataset
    copy = _copy(root, tmp_path / "d")
    model = load_model("tiny")
    spec, _ = conversation_data(model, str(copy / "data.jsonl"), 16, None, str(tok))
    gone = copy / "media" / "img_0001_green_square.png"
    gone.unlink()
    corrupt = copy / "media" / "img_0002_blue_circle.png"  # its header still reads; its pixels do not
    corrupt.write_bytes(corrupt.read_bytes()[:60])
    log = tmp_path / "data_problems.jsonl"
    ranks = [ConversationData(model, spec, DataProblems(str(log), rank)) for rank in (0, 1)]
    batches = [r.batch(0, 0) for r in ranks]
    rows = batches[0].rows
    where = {i: ranks[0].conversation(row).where for i, row in enumerate(rows)}
    green = [i for i in range(len(rows)) if where[i] == "data.jsonl:2"]
    blue = [i for i in range(len(rows)) if where[i] == "data.jsonl:3"]
    assert green and blue
    # nothing is looked at before the dispatcher's destination decodes it: the same lengths on every rank
    assert batches[0].skipped == batches[1].skipped == ()
    assert batches[0].enc_tokens == batches[1].enc_tokens and batches[0].trained == batches[1].trained
    for i in green:  # rank 0 loads the vanished image's samples, rank 1 the cut one's
        assert not batches[0].sample(i, torch.float32).feats["vision"].any()
    assert not batches[1].sample(blue[0], torch.float32).feats["vision"].any()
    problems = read_problems(str(log))
    assert {(p["rank"], p["line"], p["medium"], p["action"]) for p in problems} == {
        (0, 2, str(gone), "masked"), (1, 3, str(corrupt), "masked")}  # fmt: skip
    assert all(p["file"] == "data.jsonl" and p["step"] == 0 for p in problems)
    assert next(p for p in problems if p["line"] == 2)["error"].startswith("FileNotFoundError")
    failed = batches[0].decoded.failed() | batches[1].decoded.failed()
    assert failed == {*green, blue[0]}
    assert batches[0].data_counts()["failed"] == len(green) and batches[1].data_counts()["failed"] == 1
    agreed = batches[0].without(failed)  # what every rank makes of it (TrainStep's all-reduce)
    assert agreed.masked == tuple(sorted(failed))
    assert all(agreed.trained[i] == 0 < batches[0].trained[i] for i in failed)
    assert agreed.label_tokens == batches[0].label_tokens - sum(batches[0].trained[i] for i in failed)
    assert all((agreed.sample(i, torch.float32).labels == -100).all() for i in failed)
    assert agreed.enc_tokens == batches[0].enc_tokens  # the step's lengths, and so its tables, stand


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header says width x height (its pixels are never read: Pillow checks the size on open)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


def test_warnings_one_line_each(dataset, cli, tmp_path):
    root, data, tok = dataset
    copy = _copy(root, tmp_path / "w")
    (copy / "media" / "huge.png").write_bytes(_png_header(20000, 20000))
    extra = [
        '{"messages": [{"role": "user", "content": "<image>what?"}, {"role": "assistant", "content": "big"}], '
        '"images": ["media/huge.png"]}',
        '{"messages": [{"role": "user", "content": "no answer here"}]}',
    ]
    n = len(data.read_text().splitlines())
    (copy / "data.jsonl").write_text(data.read_text() + "\n".join(extra) + "\n")
    r = cli("data", "index", str(copy / "data.jsonl"), "--model", "tiny", "--tokenizer", str(tok))
    assert r.exit_code == 0 and "Traceback" not in r.output
    err = r.stderr.splitlines()
    huge = [line for line in err if f"data.jsonl:{n + 1}:" in line]
    assert len(huge) == 1 and "images[0]:" in huge[0] and "huge.png: too large to decode" in _one_line(r.stderr)
    assert f"warning: data.jsonl:{n + 2}: no assistant turn: trains no token" in err
    assert "warning: 2 samples skipped: 1 malformed, 1 training no token (--strict: exit 1)" in err
    shown = cli("data", "inspect", str(copy / "data.jsonl"), "--model", "tiny", "--tokenizer", str(tok),
                "--sample", str(n + 1))  # fmt: skip
    assert shown.exit_code == 1 and "Traceback" not in shown.output and "too large to decode" in shown.output
    assert shown.output.startswith(f"error: data.jsonl:{n + 1}: cannot read its media") and "huge.png" in shown.output
    plan = cli("plan", "--model", "tiny", "--cluster", "local-cpu", "--data", str(copy / "data.jsonl"), "--tokenizer",
               str(tok), "--out", str(tmp_path / "p.yaml"))  # fmt: skip
    assert plan.exit_code == 0, plan.output
    assert f"warning: global batch 256 is larger than the {n} samples of {copy / 'data.jsonl'}" in _one_line(
        plan.stderr
    )


def test_sample_numbering_is_said(dataset, cli):
    _, data, tok = dataset
    assert "numbered by file line from 1" in _one_line(cli("data", "inspect", "--help").output)
    r = cli("data", "inspect", str(data), "--model", "tiny", "--tokenizer", str(tok), "--sample", "3")
    assert r.exit_code == 0 and "--sample 3: data.jsonl:3 (samples are numbered by file line from 1" in _one_line(
        r.output
    )
    j = cli("data", "inspect", str(data), "--model", "tiny", "--tokenizer", str(tok), "--sample", "3", "--json")
    assert json.loads(j.stdout)["sample"] == 3 and "file line" in json.loads(j.stdout)["numbering"]


def test_launch_warns_of_a_batch_larger_than_the_data(dataset, cli, tmp_path):
    _, data, tok = dataset
    n = len(data.read_text().splitlines())
    plan = tmp_path / "p.yaml"
    made = cli("plan", "--model", "tiny", "--cluster", "local-cpu", "--data", str(data), "--tokenizer", str(tok),
               "--global-batch", str(n + 1), "--out", str(plan))  # fmt: skip
    assert made.exit_code == 0, made.output
    r = cli("launch", str(plan), "--executor", "torchrun", "--dry-run", "--workdir", str(tmp_path / "run"),
            "--rdzv-endpoint", "127.0.0.1:29999")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert f"warning: global batch {n + 1} is larger than the {n} samples of {data}" in _one_line(r.stderr)
