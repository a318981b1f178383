"""Spec loading: presets, the short forms of docs/design.md, and one-line errors for bad files."""

import json

import pytest

from orch.planner.data import sample_lengths, token_stats
from orch.planner.errors import SpecError, SpecErrors
from orch.planner.loading import load_cluster, load_data, parse_text, preset_names
from orch.planner.specs import ClusterSpec, DataSpec, ModelSpec
from orch.runtime.models.registry import load_model

DESIGN_MODEL = """
name: llava-1b-70b
modules:
  vision: {kind: encoder, layers: 24, hidden: 2048, heads: 16, ffn: 8192, feeds: llm}
  audio:  {kind: encoder, layers: 32, hidden: 1280, heads: 20, ffn: 5120, feeds: llm}
  llm:    {kind: llm, layers: 80, hidden: 8192, heads: 64, kv_heads: 8, ffn: 28672, vocab: 128256}
"""
DESIGN_CLUSTER = """
name: h100-80g
nodes: 8
gpus_per_node: 8
gpu: {memory_gb: 80, peak_tflops: 989}
links: {intra_node_gbps: 450, inter_node_gbps: 50}
"""
DESIGN_DATA = """
global_batch: 256
seq_len: 8192
tasks:
  - {weight: 0.5, tokens: {vision: 1152, llm: 1400}, max: {vision: 4608, llm: 8192}}
  - {weight: 0.5, tokens: {audio: 1500, llm: 500}}
"""


def test_design_md_examples_parse():
    model = parse_text(ModelSpec, "model.yaml", DESIGN_MODEL)
    assert model.llm_name == "llm" and model.encoder_names == ["vision", "audio"]
    assert model.llm.num_kv_heads == 8 and model.modules["vision"].num_kv_heads == 16
    cluster = parse_text(ClusterSpec, "cluster.yaml", DESIGN_CLUSTER)
    assert cluster.world_size == 64
    data = parse_text(DataSpec, "data.yaml", DESIGN_DATA)
    assert data.tasks[1].sigma == 0.0 and data.tasks[0].sigma == 0.5


@pytest.mark.parametrize("kind", ["model", "cluster", "data"])
def test_every_preset_loads(kind):
    loader = {"model": load_model, "cluster": load_cluster, "data": load_data}[kind]
    for name in preset_names(kind):
        loader(name)


def test_nodes_override():
    assert load_cluster("h100-80g", nodes=320).world_size == 2560


@pytest.mark.parametrize(
    ("edit", "field", "expected"),
    [
        (("llm", "bogus", 1), "modules.llm.bogus", "unknown field"),
        (("vision", "layers", -2), "modules.vision.layers", "greater than 0"),
        (("audio", "heads", 7), "modules.audio", "heads (7) must divide hidden (1280)"),
        (("llm", "kv_heads", 5), "modules.llm", "kv_heads (5) must divide heads (64)"),
    ],
)
def test_bad_model_fields_are_named(tmp_path, edit, field, expected):
    import yaml

    data = yaml.safe_load(DESIGN_MODEL)
    module, key, value = edit
    data["modules"][module][key] = value
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecErrors) as info:
        load_model(str(path))
    (line,) = info.value.lines()
    assert line.startswith(f"{path}: {field}: ")
    assert expected in line


def test_encoder_must_feed_the_llm():
    bad = DESIGN_MODEL.replace("feeds: llm}", "feeds: nowhere}", 1)
    with pytest.raises(SpecErrors, match="is not the llm module"):
        parse_text(ModelSpec, "m.yaml", bad)


def test_modality_and_frames_per_token_follow_the_field_then_the_name():
    model = parse_text(ModelSpec, "model.yaml", DESIGN_MODEL)  # no modality fields: the names decide
    assert [model.modality(n) for n in ("vision", "audio", "llm")] == ["vision", "audio", "text"]
    assert [model.modality(n).frames_per_token for n in ("vision", "audio", "llm")] == [1, 2, 1]
    speech = {**model.modules["audio"].model_dump(), "modality": "audio"}
    modules = {"speech": speech, "patches": model.modules["vision"].model_dump(), "llm": model.llm.model_dump()}
    renamed = ModelSpec.model_validate({"name": "m", "modules": modules})
    assert renamed.modality("speech").frames_per_token == 2
    assert renamed.modality("patches") == "vision"  # an encoder of no known name: a patch stem


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nnodes: [1,\n")
    with pytest.raises(SpecError, match=r"c.yaml: line \d+: not valid YAML"):
        load_cluster(str(path))


def test_unknown_preset_lists_the_presets():
    with pytest.raises(SpecError, match="presets: .*h100-80g"):
        load_cluster("h900")


def test_sampling_is_deterministic_and_follows_the_mix():
    data = load_data("omni-mix")
    a = sample_lengths(data, 2000, seed=7)
    assert a == sample_lengths(data, 2000, seed=7)
    assert a != sample_lengths(data, 2000, seed=8)
    with_audio = sum(1 for s in a if s.get("audio", 0) > 0) / len(a)
    assert 0.25 < with_audio < 0.35  # asr 0.2 + audio-visual 0.1
    for s in a:
        for module, n in s.items():
            assert n <= {"vision": 32768, "audio": 6000, "llm": 8192}[module]


def test_token_stats_of_fixed_lengths_are_exact():
    data = parse_text(DataSpec, "d", DESIGN_DATA)
    stats = token_stats(data, "audio", "llm")
    assert stats.max == 1500
    assert stats.mean == pytest.approx(1500 * stats.present)
    assert stats.mean_sq == pytest.approx(1500**2 * stats.present)


def test_manifest_data(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps({"vision": v, "llm": 100}) for v in (10, 20, 30)))
    spec = tmp_path / "d.yaml"
    spec.write_text("global_batch: 8\nseq_len: 512\nmanifest: m.jsonl\n")
    data = load_data(str(spec))
    assert sorted({s["vision"] for s in sample_lengths(data, 200, 0)}) == [10, 20, 30]


def test_manifest_bad_row_names_the_line(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"vision": 3}\n{"vision": -1}\n')
    spec = tmp_path / "d.yaml"
    spec.write_text("global_batch: 8\nseq_len: 512\nmanifest: m.jsonl\n")
    with pytest.raises(SpecError, match="line 2: vision: expected a token count >= 0"):
        sample_lengths(load_data(str(spec)), 4, 0)


def test_sampling_does_not_depend_on_yaml_key_order():
    a = parse_text(
        DataSpec,
        "a",
        "global_batch: 4\nseq_len: 64\ntasks: [{weight: 1, tokens: {vision: 9, llm: 20}, max: {vision: 40, llm: 60}}]",
    )
    b = parse_text(
        DataSpec,
        "b",
        "global_batch: 4\nseq_len: 64\ntasks: [{weight: 1, tokens: {llm: 20, vision: 9}, max: {llm: 60, vision: 40}}]",
    )
    assert sample_lengths(a, 50, 3) == sample_lengths(b, 50, 3)


def test_a_spec_or_config_file_over_the_limit_is_one_line_before_it_is_parsed(tmp_path):
    """A 17 MiB YAML line (PyYAML took 70-90 s on 50 MB before its error; the model spec accepted 1.2 GB): every
    spec and config loader refuses it at once, naming the file and the limit."""
    import json
    import time

    from orch.planner.hf_config import read_config
    from orch.planner.io import MAX_SPEC_BYTES
    from orch.planner.loading import load_json_file
    from orch.planner.plan import Plan
    from orch.runtime.data.conversations import read_sources
    from orch.runtime.models.registry import load_model
    from orch.runtime.train.config import TrainSpec

    line = "name: " + "a" * (MAX_SPEC_BYTES + 1024) + "\n"
    model, train, plan, mix = (tmp_path / n for n in ("m.yaml", "train.yaml", "plan.json", "mix.yaml"))
    for p in (model, train, mix):
        p.write_text(line)
    plan.write_text(json.dumps({"name": "a" * (MAX_SPEC_BYTES + 1024)}))
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(plan.read_text())
    t = time.perf_counter()
    for path, load in (
        (model, lambda: load_model(str(model))),
        (train, lambda: load_json_file(TrainSpec, str(train))),
        (plan, lambda: load_json_file(Plan, str(plan))),
        (mix, lambda: read_sources(str(mix))),
        (hf / "config.json", lambda: read_config(hf)),
    ):
        with pytest.raises(SpecError) as err:
            load()
        assert str(err.value) == (
            f"{path}: {path.stat().st_size:,} bytes: more than a spec or config file may hold (16 MiB, 16,777,216 "
            "bytes; is it a data file?)"
        )
    assert time.perf_counter() - t < 5  # read up to the limit, never parsed
