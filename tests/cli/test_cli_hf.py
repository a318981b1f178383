"""A Hugging Face model directory through the CLI: plan from config.json, launch, export, and bad input."""

import pytest
import yaml
from families import assert_same_weights, data_file_fixture, launch_lr0_then_export, plan_of
from hf_models import make_llava

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

DATA = {
    "global_batch": 4,
    "seq_len": 64,
    "tasks": [
        {"name": "text", "weight": 0.3, "tokens": {"llm": 20}, "max": {"llm": 40}},
        {"name": "image", "weight": 0.7, "tokens": {"vision": 16, "llm": 40}, "max": {"vision": 32, "llm": 64}},
    ],
}


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return make_llava(tmp_path_factory.mktemp("hf") / "llava", "clip", "llama")


data_file = data_file_fixture(DATA)


def test_plan_reads_config_json_and_says_what_it_derived(cli, llava, data_file, tmp_path):
    result = plan_of(cli, llava, data_file, tmp_path / "plan.yaml")
    assert "config.json: vision: 2 layers, hidden 32, 4 heads" in result.output
    assert "config.json: llm: 4 layers, hidden 48, 4 heads (2 KV), ffn 96, vocab 128" in result.output
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert plan["model"]["modules"]["llm"]["hf"] == {
        "path": str(llava.resolve()),
        "part": "text",
        "feature_layer": None,
    }
    assert plan["modules"]["vision"]["layout"]["cp"] == 1  # a tower of whole images takes no CP


@pytest.mark.slow
def test_launch_lr0_then_export_returns_the_weights_bit_for_bit(cli, llava, data_file, tmp_path):
    plan_of(cli, llava, data_file, tmp_path / "plan.yaml", "--placement", "colocated", "--fix", "llm.tp=2")
    # no checkpoint_every: a run's last step is saved whatever the config says
    out = launch_lr0_then_export(cli, tmp_path / "plan.yaml", tmp_path / "run", tmp_path / "exported")
    assert_same_weights(llava / "model.safetensors", out / "model.safetensors")
    assert (out / "config.json").read_text() == (llava / "config.json").read_text()


def test_safetensors_shape_mismatch_is_one_line_before_any_rank(cli, llava, data_file, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(llava, broken)
    weights = load_file(broken / "model.safetensors")
    key = next(k for k in weights if k.endswith("layers.1.self_attn.q_proj.weight"))
    weights[key] = weights[key][:-1]
    save_file(weights, str(broken / "model.safetensors"))
    plan_of(cli, broken, data_file, tmp_path / "plan.yaml")
    result = cli("launch", str(tmp_path / "plan.yaml"), "--workdir", str(tmp_path / "run"))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == [
        f"error: {broken / 'model.safetensors'}: {key}: shape [47, 48] does not match the config's [48, 48]"
    ]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_tied_embeddings_keep_the_llm_on_one_stage(cli, data_file, tmp_path):
    """A tied head (Qwen2-0.5B, Llama-3.2-1B) cannot be split from its embedding: the planner never gives the
    LLM a pipeline (its pins say why), and a plan file edited to one is refused before any rank starts."""
    tied = make_llava(tmp_path / "tied", "siglip", "qwen2", tie_word_embeddings=True)
    why = "the model ties its embedding and head (tie_word_embeddings), which a pipeline would split over two stages"
    pinned = cli("plan", "--model", str(tied), "--cluster", "local-cpu", "--data", str(data_file),
                 "--fix", "llm.pp=2", "--placement", "colocated")  # fmt: skip
    assert pinned.exit_code == 1
    assert pinned.output.strip().splitlines()[-1] == f"error: --fix: llm.pp=2: {why}"
    result = plan_of(cli, tied, data_file, tmp_path / "plan.yaml", "--placement", "colocated")
    assert "tied embedding and head (one pipeline stage)" in " ".join(result.output.split())
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert plan["model"]["modules"]["llm"]["tied_embeddings"] is True
    assert plan["modules"]["llm"]["layout"]["pp"] == 1
    layout = plan["modules"]["llm"]["layout"]
    layout["pp"], layout["dp"] = 2, layout["dp"] // 2
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(plan))
    launched = cli("launch", str(tmp_path / "edited.yaml"), "--workdir", str(tmp_path / "run"))
    assert launched.exit_code == 1
    assert launched.output.strip() == f"error: modules.llm.layout.pp: 2: {why}"
    # a plan file from before specs recorded the tie: the built module's shared weight still refuses it
    plan["model"]["modules"]["llm"].pop("tied_embeddings")
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(plan))
    launched = cli("launch", str(tmp_path / "old.yaml"), "--workdir", str(tmp_path / "run"))
    assert launched.exit_code == 1
    assert launched.output.strip() == f"error: modules.llm.layout.pp: 2: {why}"


def test_an_untied_llm_may_take_a_pipeline(tmp_path):
    from orch.planner.candidates import SearchInput, degrees
    from orch.planner.loading import load_cluster, load_data
    from orch.runtime.models.registry import model_spec_from_dir

    untied = model_spec_from_dir(make_llava(tmp_path / "untied", "siglip", "qwen2"))
    tied = model_spec_from_dir(make_llava(tmp_path / "tied", "siglip", "qwen2", tie_word_embeddings=True))
    assert not untied.modules["llm"].tied_embeddings and tied.modules["llm"].tied_embeddings
    assert not tied.modules["vision"].tied_embeddings
    for spec, want in ((untied, (1, 2, 4)), (tied, (1,))):
        inp = SearchInput(spec, load_cluster("h100-80g"), load_data("tiny-mix"))
        assert degrees(inp, "llm", allow_pp=True).pp == want


def test_not_a_model_directory(cli, tmp_path, data_file):
    result = cli("plan", "--model", str(tmp_path), "--cluster", "local-cpu", "--data", str(data_file))
    assert result.exit_code == 1
    assert (
        result.output.strip()
        == f"error: {tmp_path}: a model directory needs config.json (a Hugging Face model directory)"
    )


def composed_spec(tmp_path, vision="parts/siglip", llm="parts/qwen2"):
    from hf_models import make_parts

    make_parts(tmp_path / "parts")
    spec = tmp_path / "composed.yaml"
    spec.write_text(yaml.safe_dump({"name": "joined", "modules": {
        "vision": {"hf": vision, "feeds": "llm", "trainable": False}, "llm": {"hf": llm}}}))  # fmt: skip
    return spec


@pytest.mark.slow
def test_composed_spec_exports_one_directory_per_source_and_the_projectors(cli, data_file, tmp_path, train_config):
    from safetensors.torch import load_file

    spec = composed_spec(tmp_path)
    plan_of(cli, spec, data_file, tmp_path / "plan.yaml", "--placement", "homogeneous")
    out = launch_lr0_then_export(cli, tmp_path / "plan.yaml", tmp_path / "run", tmp_path / "exported",
                                 "--config", train_config(checkpoint_every=1))  # fmt: skip
    for module, source in (("vision", "siglip"), ("llm", "qwen2")):
        assert_same_weights(tmp_path / "parts" / source / "model.safetensors", out / module / "model.safetensors")
    projectors = load_file(out / "projectors.safetensors")
    assert sorted(projectors) == [
        f"vision.multi_modal_projector.linear_{i}.{w}" for i in (1, 2) for w in ("bias", "weight")
    ]


def test_composed_module_whose_source_has_the_wrong_tower(cli, data_file, tmp_path):
    spec = composed_spec(tmp_path, vision="parts/qwen2")
    result = cli("plan", "--model", str(spec), "--cluster", "local-cpu", "--data", str(data_file))
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"error: {spec}: modules.vision.hf: {(tmp_path / 'parts' / 'qwen2').resolve()} holds a qwen2 model; "
        "an encoder needs one of clip_vision_model, siglip_vision_model, whisper"
    )


def test_composed_module_may_not_restate_what_config_json_gives(cli, data_file, tmp_path):
    spec = composed_spec(tmp_path)
    text = yaml.safe_load(spec.read_text())
    text["modules"]["llm"]["layers"] = 3
    spec.write_text(yaml.safe_dump(text))
    result = cli("plan", "--model", str(spec), "--cluster", "local-cpu", "--data", str(data_file))
    assert result.exit_code == 1
    assert (
        result.output.strip() == f"error: {spec}: modules.llm.layers: comes from the hf source's config.json; remove it"
    )
