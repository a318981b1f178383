"""`orch plan`, `orch presets`, `orch schema` through the CLI: JSON contract, files, errors."""

import json

import pytest
import yaml

from orch.planner.loading import preset_names
from orch.planner.plan import Plan

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

CLUSTER_FOR = {
    "tiny": ("local-cpu", "2"),
    "tiny-moe": ("local-cpu", "2"),
    "llava-1b-14b": ("h100-80g", "2"),
    "vit-12b-120b": ("h100-80g", "16"),
}


@pytest.mark.parametrize("model", preset_names("model"))
def test_every_model_preset_plans(cli, tmp_path, model):
    cluster, nodes = CLUSTER_FOR.get(model, ("h100-80g", "8"))
    out = tmp_path / "plan.yaml"
    result = cli("plan", "--model", model, "--cluster", cluster, "--nodes", nodes, "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate_json(result.stdout)
    # the file on disk is the same plan
    assert Plan.model_validate(yaml.safe_load(out.read_text())) == plan
    assert plan.world_size == int(nodes) * plan.cluster.gpus_per_node
    for mp in plan.modules.values():
        assert all(0 <= r < plan.world_size for r in mp.ranks)
        assert len(mp.ranks) == mp.layout.gpus


def test_plan_json_has_the_design_md_shape(cli, tmp_path):
    result = cli("plan", "-m", "llava-1b-70b", "-c", "h100-80g", "-n", "8", "-o", str(tmp_path / "p.yaml"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["version"] == 1
    assert doc["placement"] in ("homogeneous", "colocated", "disaggregated")
    assert doc["world_size"] == 64
    for mod in doc["modules"].values():
        assert set(mod["layout"]) == {"tp", "cp", "pp", "dp", "ep"}
        assert {"ranks", "micro_batch", "memory_gb"} <= set(mod)
    assert {e["kind"] for e in doc["edges"]} <= {"fan_in", "fan_out", "equal_dp"}
    assert {"step_time_s", "tokens_per_s", "mfu"} <= set(doc["predicted"])
    assert doc["baseline"]["placement"] == "homogeneous"
    assert {"step_time_s", "tokens_per_s", "mfu"} <= set(doc["baseline"]["predicted"])


def test_disaggregated_plan_has_disjoint_islands_and_p2p_edges(cli, tmp_path):
    result = cli("plan", "-m", "tiny", "-c", "local-cpu", "--placement", "disaggregated", "--fix", "vision.gpus=2",
                 "-o", str(tmp_path / "p.yaml"), "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate_json(result.stdout)
    assert plan.schedule == "graph_1f1b"
    assert plan.modules["vision"].ranks == plan.modules["audio"].ranks == [0, 1]
    assert plan.modules["llm"].ranks == [2, 3]
    assert {e.transport for e in plan.edges} == {"p2p"}
    expected = {"equal_dp" if plan.modules["llm"].layout.dp == 2 else "fan_in"}
    assert {e.kind for e in plan.edges} == expected


def test_human_output_and_trace(cli, tmp_path):
    trace = tmp_path / "t.json"
    result = cli("plan", "-m", "omni-84b", "-c", "h100-80g", "-n", "8", "-o", str(tmp_path / "p.yaml"),
                 "--trace", str(trace))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # people's output goes to stderr
    assert "baseline (homogeneous)" in result.stderr and "node    0" in result.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert {"vision", "audio", "llm"} <= {e["pid"] for e in events}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)


def test_presets_json(cli):
    result = cli("presets", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {(r["kind"], r["name"]) for r in rows} >= {("model", "tiny"), ("cluster", "h200-141g"), ("data", "omni-mix")}


@pytest.mark.parametrize("kind", ["model", "cluster", "data", "plan", "profile", "metrics", "train"])
def test_schema(cli, kind):
    result = cli("schema", kind)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["type"] == "object"


def _single_error_line(result) -> str:
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_bad_model_file_gives_one_line(cli, tmp_path):
    bad = tmp_path / "model.yaml"
    bad.write_text(
        "name: x\nmodules:\n"
        "  vision: {kind: encoder, layers: 2, hidden: 100, heads: 3, ffn: 64, feeds: llm}\n"
        "  llm: {kind: llm, layers: 2, hidden: 64, heads: 4, ffn: 64, vocab: 10}\n"
    )
    line = _single_error_line(
        cli("plan", "-m", str(bad), "-c", "local-cpu", "-d", "tiny-mix", "-o", str(tmp_path / "p"))
    )
    assert line == f"error: {bad}: modules.vision: heads (3) must divide hidden (100)"


def test_negative_size_and_unknown_field_in_cluster(cli, tmp_path):
    bad = tmp_path / "cluster.yaml"
    bad.write_text(
        "name: c\nnodes: -1\ngpus_per_node: 8\ngpu: {memory_gb: 80, peak_tflops: 989}\n"
        "links: {intra_node_gbps: 450, inter_node_gbps: 50}\n"
    )
    line = _single_error_line(cli("plan", "-m", "tiny", "-c", str(bad), "-o", str(tmp_path / "p")))
    assert line.startswith(f"error: {bad}: nodes: Input should be greater than 0")
    bad.write_text(bad.read_text().replace("nodes: -1", "nodes: 1\nnics: 4"))
    line = _single_error_line(cli("plan", "-m", "tiny", "-c", str(bad), "-o", str(tmp_path / "p")))
    assert line == f"error: {bad}: nics: unknown field"


def test_cluster_too_small(cli, tmp_path):
    line = _single_error_line(cli("plan", "-m", "vit-12b-120b", "-c", "h100-80g", "-n", "1", "-o", str(tmp_path / "p")))
    assert "gpu.memory_gb: model 'vit-12b-120b' needs about" in line


def _small_cluster(tmp_path, gpu: str):
    path = tmp_path / "small.yaml"
    path.write_text(
        f"name: small\nnodes: 1\ngpus_per_node: 2\ngpu: {{{gpu}}}\nlinks: {{intra_node_gbps: 2, inter_node_gbps: 1}}\n"
    )
    return path


def test_the_reserve_is_a_cluster_field_a_small_device_plans_with(cli, tmp_path):
    """A 2 GB accelerator (or CPU rank) plans once its reserve says what it keeps back, and the table says which
    share the plan may fill; the CUDA default of 3 GB is named, not taken off silently."""
    small = _small_cluster(tmp_path, "memory_gb: 2, peak_tflops: 1, reserve_gb: 0.25")
    result = cli("plan", "-m", "tiny", "-c", str(small), "-o", str(tmp_path / "p.yaml"))
    assert result.exit_code == 0, result.output
    assert "GB/GPU of 1.75" in result.stderr  # people's output goes to stderr
    assert "2 GB less a 0.25 GB reserve" in " ".join(result.stderr.split())
    cpu = _small_cluster(tmp_path, "memory_gb: 1, peak_tflops: 0.05, device: cpu")  # a CPU rank keeps 0.5 back
    result = cli("plan", "-m", "tiny", "-c", str(cpu), "-o", str(tmp_path / "p.yaml"), "--json")
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate_json(result.stdout)
    assert plan.cluster.gpu.usable_gb == 0.5 and all(mp.memory_gb <= 0.5 for mp in plan.modules.values())
    gpu = _small_cluster(tmp_path, "memory_gb: 2, peak_tflops: 1")
    line = _single_error_line(cli("plan", "-m", "tiny", "-c", str(gpu), "-o", str(tmp_path / "p.yaml")))
    assert line.startswith(f"error: {gpu}: gpu: reserve_gb (3) leaves nothing of memory_gb (2)")


def test_data_naming_a_missing_module(cli, tmp_path):
    data = tmp_path / "d.yaml"
    data.write_text("global_batch: 8\nseq_len: 64\ntasks:\n  - {weight: 1, tokens: {video: 3, llm: 9}}\n")
    line = _single_error_line(cli("plan", "-m", "tiny", "-c", "local-cpu", "-d", str(data), "-o", str(tmp_path / "p")))
    assert line.startswith(f"error: {data}: tasks.0.tokens.video: model 'tiny' has no module 'video'")


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("llm.xx=2", "no axis 'xx'"),
        ("foo.tp=2", "no module 'foo'"),
        ("llm.tp=two", "expected a positive integer degree"),
        ("llmtp2", "expected MODULE.AXIS=N"),
    ],
)
def test_bad_fix(cli, tmp_path, flag, expected):
    line = _single_error_line(cli("plan", "-m", "tiny", "-c", "local-cpu", "--fix", flag, "-o", str(tmp_path / "p")))
    assert line.startswith("error: --fix: ") and expected in line


def test_bad_placement_and_unknown_preset(cli, tmp_path):
    line = _single_error_line(
        cli("plan", "-m", "tiny", "-c", "local-cpu", "--placement", "x", "-o", str(tmp_path / "p"))
    )
    assert "--placement" in line
    line = _single_error_line(cli("plan", "-m", "tiny", "-c", "a100", "-o", str(tmp_path / "p")))
    assert line.startswith("error: a100: no such cluster file or preset; presets: ")


# A model written as docs/design.md shows it: no input_dim, no data.
FRESH_MODEL = """\
name: fresh
modules:
  vision: {kind: encoder, layers: 2, hidden: 32, heads: 4, ffn: 64, feeds: llm}
  audio:  {kind: encoder, layers: 2, hidden: 32, heads: 4, ffn: 64, feeds: llm}
  llm:    {kind: llm, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 512}
"""


def test_a_model_without_data_plans_on_a_default_mix_and_says_so(cli, tmp_path):
    from orch.planner.plan import Plan

    model = tmp_path / "model.yaml"
    model.write_text(FRESH_MODEL)
    result = cli("plan", "-m", str(model), "-c", "local-cpu", "--json", "--top", "0")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())  # the hint wraps at the terminal's width
    assert said.count("hint:") == 1 and "planned on a default mix (text, vision, audio;" in said
    plan = Plan.model_validate_json(result.stdout)
    assert plan.data.name == "default-mix-fresh"  # recorded in the plan, so `orch launch` trains on it
    assert {t.name for t in plan.data.tasks} == {"text", "vision", "audio"}
    assert sum(t.weight for t in plan.data.tasks) == pytest.approx(1.0)
    # the encoders' input_dim: the modality's documented default, recorded too
    assert (plan.model.modules["vision"].input_dim, plan.model.modules["audio"].input_dim) == (588, 128)


def test_a_model_without_input_dim_that_plans_also_launches(cli, tmp_path, train_config):
    """Before: planned, then every rank died with `AssertionError: encoders need input_dim`."""
    import json

    model = tmp_path / "model.yaml"
    model.write_text(FRESH_MODEL)
    plan = tmp_path / "plan.yaml"
    planned = cli("plan", "-m", str(model), "-c", "local-cpu", "-d", "tiny-mix", "--nodes", "1", "--out", str(plan))
    assert planned.exit_code == 0, planned.output
    run = tmp_path / "run"
    launched = cli("launch", str(plan), "--steps", "1", "--workdir", str(run), "--config", train_config(balance="none"))
    assert launched.exit_code == 0, launched.output
    (line,) = (run / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["loss"] > 0


def test_a_text_encoder_without_input_dim_is_one_line(cli, tmp_path):
    model = tmp_path / "model.yaml"
    model.write_text(FRESH_MODEL.replace("vision: {kind: encoder,", "vision: {kind: encoder, modality: text,"))
    line = _single_error_line(cli("plan", "-m", str(model), "-c", "local-cpu"))
    assert line.startswith(f"error: {model}:") and "modules.vision.input_dim: a text encoder needs input_dim" in line


def test_a_batch_that_no_dp_divides_still_plans(cli, tmp_path):
    """12 samples on 5 GPUs: DP 5 holds 3 or 2 samples a rank (before: no homogeneous layout at all)."""
    from orch.planner.plan import Plan

    cluster = tmp_path / "five.yaml"
    cluster.write_text(
        "name: five\nnodes: 1\ngpus_per_node: 5\ngpu: {memory_gb: 4, peak_tflops: 0.05}\n"
        "links: {intra_node_gbps: 2, inter_node_gbps: 1}\ncpus_per_gpu: 1\n"
    )
    data = tmp_path / "d12.yaml"
    data.write_text(
        "global_batch: 12\nseq_len: 256\ntasks:\n"
        "  - {weight: 0.5, tokens: {llm: 24}, max: {llm: 128}}\n"
        "  - {weight: 0.5, tokens: {vision: 16, llm: 24}, max: {vision: 64, llm: 96}}\n"
    )
    result = cli("plan", "-m", "tiny", "-c", str(cluster), "-d", str(data), "--placement", "homogeneous", "--json")
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate_json(result.stdout)
    llm = plan.modules["llm"]
    assert llm.layout.dp == 5 and llm.micro_batch * llm.num_micro_batches == 3  # the fullest rank: ceil(12 / 5)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["edges"][0].update(src="video"), "edges.0.src: no module 'video'"),
        (lambda d: d.update(world_size=8), "world_size: 8 ranks, but the modules hold only 0-3 (4); ranks 4-7"),
    ],
)
def test_a_hand_edited_plan_that_disagrees_with_its_modules_is_one_line(cli, tmp_path, edit, expected):
    """Issue 33: an edge from a module that does not exist, or idle ranks, were accepted."""
    out = tmp_path / "plan.yaml"
    assert cli("plan", "-m", "tiny", "-c", "local-cpu", "-o", str(out), "--top", "0").exit_code == 0
    doc = yaml.safe_load(out.read_text())
    edit(doc)
    out.write_text(yaml.safe_dump(doc))
    result = cli("launch", str(out), "--executor", "local", "--workdir", str(tmp_path / "run"))
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.output


def test_global_batch_overrides_a_data_preset(cli, tmp_path):
    out = tmp_path / "plan.yaml"
    result = cli("plan", "-m", "tiny", "-c", "local-cpu", "-o", str(out), "--global-batch", "12", "--top", "0")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["data"]["global_batch"] == 12


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("zero3", "expected one of auto, keep, reshard or MODULE=MODE, got 'zero3'"),
        ("llm=zero3", "expected one of auto, keep, reshard or MODULE=MODE, got 'zero3'"),
        ("lm=reshard", "no module 'lm'; expected one of ['audio', 'llm', 'vision']"),
    ],
)
def test_bad_sharding_gives_one_line(cli, tmp_path, value, said):
    result = cli("plan", "-m", "tiny", "-c", "local-cpu", "--sharding", value, "-o", str(tmp_path / "p.yaml"))
    line = _single_error_line(result)
    assert "--sharding" in line and said in line, line


def test_sharding_pins_one_module(cli, tmp_path):
    out = tmp_path / "plan.yaml"
    args = ("plan", "-m", "tiny", "-c", "local-cpu", "--data-parallel", "fsdp", "-o", str(out))
    assert cli(*args, "--sharding", "llm=reshard").exit_code == 0
    plan = Plan.model_validate(yaml.safe_load(out.read_text()))
    assert plan.modules["llm"].sharding.value == "reshard"
    assert {plan.modules[e].sharding.value for e in ("vision", "audio")} == {"keep"}  # tiny: keep is faster
    assert cli(*args, "--sharding", "reshard").exit_code == 0
    plan = Plan.model_validate(yaml.safe_load(out.read_text()))
    assert {mp.sharding.value for mp in plan.modules.values()} == {"reshard"}


def test_a_plan_file_without_sharding_keeps(cli, tmp_path):
    out = tmp_path / "plan.yaml"
    assert cli("plan", "-m", "tiny", "-c", "local-cpu", "-o", str(out)).exit_code == 0
    raw = yaml.safe_load(out.read_text())
    for mp in raw["modules"].values():
        mp.pop("sharding")  # a plan written before the field existed
    plan = Plan.model_validate(raw)
    assert {mp.sharding.value for mp in plan.modules.values()} == {"keep"}


def _orch_into_closed_pipe(tmp_path, *args: str, stderr_too: bool) -> int:
    """`orch ARGS | head -0` as a shell runs it: stdout (and stderr, as `2>&1`) a pipe whose reader is gone
    before the first line is written, so every write meets EPIPE. The exit code."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        cmd = [sys.executable, "-c", "from orch.cli.app import main; main()", *args]
        stderr = write_end if stderr_too else subprocess.DEVNULL
        return subprocess.run(cmd, stdout=write_end, stderr=stderr, cwd=tmp_path, timeout=120).returncode
    finally:
        os.close(write_end)


def test_a_closed_pipe_still_gets_the_plan_written_and_exits_zero(tmp_path):
    """`orch plan ... 2>&1 | head`: the plan is on disk before a line is printed (here a hint comes first: the
    model names no data), and the closed pipe ends the command quietly with exit code 0."""
    from orch.planner.loading import resolve

    _, text = resolve("model", "tiny")
    spec = yaml.safe_load(text)
    del spec["data"]
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(spec))
    args = ("plan", "--model", "model.yaml", "--cluster", "local-cpu", "--time-limit", "2")
    assert _orch_into_closed_pipe(tmp_path, *args, "--out", "plan.yaml", stderr_too=True) == 0
    plan = Plan.model_validate(yaml.safe_load((tmp_path / "plan.yaml").read_text()))
    assert plan.world_size == 4
    assert _orch_into_closed_pipe(tmp_path, *args, "--out", "json.yaml", "--json", stderr_too=False) == 0
    assert Plan.model_validate(yaml.safe_load((tmp_path / "json.yaml").read_text())) == plan


def test_head_after_the_first_line_exits_zero(tmp_path):
    """`orch plan ... 2>&1 | head -1` through a shell, the rc of orch (pipefail)."""
    import shlex
    import subprocess
    import sys

    orch = shlex.join([sys.executable, "-c", "from orch.cli.app import main; main()"])
    line = (
        f"set -o pipefail; {orch} plan --model tiny --cluster local-cpu --time-limit 2 --out plan.yaml 2>&1 | head -1"
    )
    done = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    assert Plan.model_validate(yaml.safe_load((tmp_path / "plan.yaml").read_text())).world_size == 4
