"""A Qwen2.5-Omni directory (tests/qwen_omni_models.py) through the CLI: `orch plan --model DIR` says what it
derived of the thinker (both towers and the LLM) and plans them, an island per tower when asked; launched at lr 0
and exported back bit for bit, talker and token2wav as they came, into a directory
Qwen2_5OmniForConditionalGeneration loads."""

import pytest
import yaml
from families import OMNI_DATA, assert_same_weights, data_file_fixture, launch_lr0_then_export, plan_of
from qwen_omni_models import make_qwen_omni

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

DATA = {**OMNI_DATA, "global_batch": 8}


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    return make_qwen_omni(tmp_path_factory.mktemp("hf") / "qwen2_5_omni")


data_file = data_file_fixture(DATA)


def test_plan_of_a_qwen_omni_directory_says_what_it_derived(cli, omni, data_file, tmp_path):
    out = tmp_path / "plan.yaml"
    printed = " ".join(plan_of(cli, omni, data_file, out, "--placement", "disaggregated").output.split())
    assert (
        "config.json: audio: 2 layers, hidden 32, 4 heads, ffn 64, 16 mel bins, 2 tokens per LLM token, clips of "
        "8 tokens" in printed
    )
    assert "config.json: vision: 2 blocks (1 full-attention, the rest in 16-patch windows), width 32" in printed
    assert "config.json: llm: 4 layers, hidden 48, 4 heads (2 KV), ffn 96" in printed
    plan = yaml.safe_load(out.read_text())
    ranks = {name: set(m["ranks"]) for name, m in plan["modules"].items()}
    assert set(ranks) == {"audio", "vision", "llm"}
    assert not ranks["audio"] & ranks["vision"] and not (ranks["audio"] | ranks["vision"]) & ranks["llm"]


@pytest.mark.slow
def test_launch_lr0_then_export_returns_the_weights_bit_for_bit(cli, omni, data_file, tmp_path):
    import torch
    import transformers
    from families import ONE_RANK, write_yaml

    plan = tmp_path / "plan.yaml"
    plan_of(cli, omni, data_file, plan, cluster=str(write_yaml(tmp_path / "one.yaml", ONE_RANK)))
    out = launch_lr0_then_export(cli, plan, tmp_path / "run", tmp_path / "exported")
    assert_same_weights(omni / "model.safetensors", out / "model.safetensors")  # talker and token2wav included
    assert (out / "spk_dict.pt").read_bytes() == (omni / "spk_dict.pt").read_bytes()
    back = transformers.Qwen2_5OmniForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    assert back.thinker.model.audio_tower.layers[0].fc1.weight.dtype == torch.float64


@pytest.fixture(scope="module")
def omni_file(tmp_path_factory):
    """A conversation file as an omni SFT set has them: text, an image, ASR clips of 2 s and 6 s, a video of 2 s
    with its own sound (`use_audio_in_video` on the record)."""
    import json

    import numpy as np
    from PIL import Image
    from sounding_media import pcm, write_sounding_video, write_wav

    folder = tmp_path_factory.mktemp("omni-data")
    Image.fromarray(np.zeros((56, 112, 3), dtype=np.uint8)).save(folder / "cat.png")
    write_wav(folder / "short.wav", pcm(2.0, channels=1))
    write_wav(folder / "long.wav", pcm(6.0, channels=1))
    write_sounding_video(folder / "talk.mkv", frames=4, fps=2, sound=pcm(2.0))

    def turn(user, **media):
        return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "a cat"}], **media}

    records = [
        turn("what is it"),
        turn("<image>what is it", images=["cat.png"]),
        turn("<audio>transcribe", audios=["short.wav"]),
        turn("<audio>transcribe", audios=["long.wav"]),
        turn("<video>what does she say", videos=["talk.mkv"], use_audio_in_video=True),
    ]
    path = folder / "omni.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_plan_and_analyze_of_an_omni_file_see_both_towers_spreads(cli, omni, omni_file, tmp_path):
    """`orch plan --data FILE` prices each sample by its own lengths per tower (the index's manifest: a clip's
    tower tokens, 50 a second; the video's frames and its own sound), and `orch analyze` balances both towers'
    phases from the same file."""
    import json
    from pathlib import Path

    out = tmp_path / "plan.yaml"
    r = cli("plan", "--model", str(omni), "--cluster", "local-cpu", "--data", str(omni_file), "--global-batch", "4",
            "--index-dir", str(tmp_path / "index"), "-o", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    manifest = yaml.safe_load(out.read_text())["data"]["manifest"]
    lengths = [json.loads(line)["lengths"] for line in Path(manifest).read_text().splitlines()]
    assert [(n["audio"], n["vision"] > 0) for n in lengths] == [(0, False), (0, True), (100, False), (300, False),
                                                                 (100, True)]  # fmt: skip
    assert lengths[1]["vision"] == 4 * 8  # 56 x 112 px: 4 x 8 patches of 14 px

    r = cli("analyze", str(omni_file), "--model", str(omni), "--dp", "2", "--ranks-per-node", "2", "--micro-batch",
            "4", "--steps", "4", "--index-dir", str(tmp_path / "index"), "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    printed = json.loads(r.output[r.output.index("{") :])
    assert set(printed["phases"]) == set(printed["histograms"]) == {"audio", "vision", "llm"}
    for tower in ("audio", "vision"):
        none = printed["phases"][tower]["none"]
        assert none["max_cost"] >= none["mean_cost"] > 0, (tower, none)
