"""Qwen2-Audio on clips of every length mod 4 against Qwen2AudioForConditionalGeneration's own forward (its
processor's `input_features` and `feature_attention_mask`, float64): orch's audio tower outputs (each clip's
tokens, as HF places them in the LLM's input) and its step-0 loss in one process, 1e-9. HF's tower attends over
(l - 1) // 2 + 1 positions of a clip of l log-mel frames and its stem reads the extractor's frames past the
clip's last token: a clip's rows carry both (runtime/models/qwen2_audio/media.py), and a sample's clips run each
in its own window."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hf_models import CHATML, make_chat_tokenizer, make_qwen2_audio

WINDOW_SECONDS = 1  # the feature extractor's chunk: 100 frames, a tower of 50 positions
# log-mel frames l of each clip (samples = 160 (l - 1) + 77): every l mod 4, twice, and a short one
FRAMES = [[40, 41, 42, 43], [44], [45, 46, 47, 13]]


@pytest.fixture(scope="module")
def qwen2_audio(tmp_path_factory):
    import soundfile
    import transformers

    root = tmp_path_factory.mktemp("qwen2-audio")
    tok = make_chat_tokenizer(root / "tok")
    audio_id = tok.convert_tokens_to_ids("<|AUDIO|>")
    model = make_qwen2_audio(root / "m", audio_token=audio_id, vocab=len(tok), max_source_positions=50)
    extractor = transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=WINDOW_SECONDS)
    processor = transformers.Qwen2AudioProcessor(feature_extractor=extractor, tokenizer=tok, chat_template=CHATML)
    processor.save_pretrained(model)
    rng = np.random.default_rng(0)
    lines = []
    for s, clips in enumerate(FRAMES):
        names = []
        for k, frames in enumerate(clips):
            name = f"{s}_{k}.wav"
            soundfile.write(root / name, (0.3 * rng.standard_normal(160 * (frames - 1) + 77)).astype(np.float32),
                            16000, subtype="FLOAT")  # fmt: skip
            names.append(name)
        question = " and ".join(["<audio>"] * len(clips)) + " transcribe the sound"
        lines.append({"messages": [{"role": "user", "content": question},
                                   {"role": "assistant", "content": "a red circle"}], "audios": names})  # fmt: skip
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return model, processor, data


def _hf_forward(hf, processor, conv, shown):
    """HF's logits of one sample and the audio rows its forward placed in the LLM's input (the processor's
    features of the sample's clips, its `feature_attention_mask`)."""
    import soundfile

    waves = [soundfile.read(f, dtype="float32")[0] for f in conv.audios]
    feats = processor.feature_extractor(waves, sampling_rate=16000, padding="max_length", return_attention_mask=True,
                                        return_tensors="pt")  # fmt: skip
    assert feats["attention_mask"].sum(-1).tolist() == [len(w) // 160 + 1 for w in waves]  # l frames each
    ids = torch.tensor([shown["input_ids"]])
    placed = {}

    def keep(module, args, kwargs):
        placed["rows"] = kwargs["inputs_embeds"][0, ids[0] == hf.config.audio_token_id].detach()

    handle = hf.model.language_model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        logits = hf(input_ids=ids, input_features=feats["input_features"].to(torch.float64),
                    feature_attention_mask=feats["attention_mask"]).logits[0]  # fmt: skip
    finally:
        handle.remove()
    return logits, placed["rows"]


def test_every_clip_length_is_hfs_forward(qwen2_audio):
    import transformers

    from orch.cli.data_cmd import conversation_data
    from orch.runtime.data.processing import as_json, process
    from orch.runtime.data.source import BatchSource
    from orch.runtime.models.build import build_modules
    from orch.runtime.models.registry import model_spec_from_dir
    from orch.runtime.train.compute import encode
    from orch.runtime.train.single_process import run_reference

    directory, processor, data_file = qwen2_audio
    model = model_spec_from_dir(directory)
    data, _ = conversation_data(model, str(data_file), len(FRAMES), None, None)

    hf = transformers.Qwen2AudioForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    audio = build_modules(model, 0, torch.float64, names=["audio"])["audio"]
    audio.materialize(torch.device("cpu"), 0, "audio")
    source = BatchSource(model, data, 0).files
    assert source is not None
    batch = source.batch(0, 0)
    total, count = torch.zeros((), dtype=torch.float64), 0
    for i, row in enumerate(batch.rows):
        conv = source.conversation(row)
        shown = as_json(process(conv, model, source.rules, source.counter, data.seq_len, processors=source.processors),
                        model, source.counter)  # fmt: skip
        with torch.no_grad():
            logits, want = _hf_forward(hf, processor, conv, shown)
            got = encode(audio, "audio", [batch.sample(i, torch.float64)], torch.float64, 2)
        assert got.shape == want.shape and float((got - want).abs().max()) <= 1e-9 * float(want.abs().max()), (
            conv.audios
        )
        labels = torch.tensor(shown["labels"])
        total += F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
        count += int((labels[1:] != -100).sum())

    got_loss = run_reference(model, data, seed=0, steps=1, dtype=torch.float64, optimizer="sgd", lr=0.0).losses[0]
    assert got_loss == pytest.approx(float(total / count), rel=1e-9)
