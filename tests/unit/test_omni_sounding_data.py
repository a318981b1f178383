"""After merging wt-omni and wt-omnivideo: a data file's videos with their sound (use_audio_in_video) through the
data path, for Qwen2.5-Omni: the TMRoPE positions of the batch's layouts equal HF's get_rope_index(use_audio_in_video=
True) on the input_ids `orch data inspect --use-audio-in-video` gives (LLaMA-Factory's <video><audio> pair, and a
video's own track decoded from the video)."""

import json
import math

import pytest
import torch
import transformers
from qwen_omni_models import make_qwen_omni
from sounding_media import pcm, write_sounding_video, write_wav
from test_qwen_omni import hf_rope_index


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    return make_qwen_omni(tmp_path_factory.mktemp("omni") / "m")


@pytest.mark.parametrize("shape", ["llamafactory", "own_track"])
def test_a_sounding_videos_positions_are_hfs(cli, omni, tmp_path, shape):
    from orch.cli.data_cmd import conversation_data
    from orch.runtime.data.source import ConversationData
    from orch.runtime.models.registry import load_model

    sound = pcm(5.0)
    write_sounding_video(tmp_path / "v.mkv", frames=10, fps=2, sound=sound, size=(56, 56))
    write_wav(tmp_path / "v.wav", sound)
    user = "<video><audio>what does she say?" if shape == "llamafactory" else "<video>what does she say?"
    record = {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "hello"}],
        "videos": ["v.mkv"],
        **({"audios": ["v.wav"]} if shape == "llamafactory" else {}),
    }
    (tmp_path / "d.jsonl").write_text(json.dumps(record) + "\n")
    r = cli("data", "inspect", str(tmp_path / "d.jsonl"), "--model", str(omni), "--json", "--use-audio-in-video")
    assert r.exit_code == 0, r.output
    ids = json.loads(r.output[r.output.index("{") :])["input_ids"]
    model = load_model(str(omni))
    spec = conversation_data(model, str(tmp_path / "d.jsonl"), 1, None, None, use_audio_in_video=True)[0]
    batch = ConversationData(model, spec).batch(0, 0)
    (video,) = batch.items("vision", 0)
    assert video.sound is not None and video.sound.rows > 0
    config = transformers.AutoConfig.from_pretrained(omni).thinker_config
    want, _ = hf_rope_index(config)(
        input_ids=torch.tensor([ids]),
        video_grid_thw=torch.tensor([video.grid]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        use_audio_in_video=True,
        audio_seqlens=torch.tensor([math.ceil(sound.shape[1] / 160)]),
        second_per_grids=torch.tensor([video.seconds]),
    )
    assert torch.equal(batch.layout(0).positions, want[:, 0])
    print(shape, video, len(ids), ids.count(config.audio_token_id), ids.count(config.video_token_id))
