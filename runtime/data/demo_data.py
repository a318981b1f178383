"""A small dataset of the kind users bring, made locally (for the tests, the benchmarks and the demo):
Pillow images of coloured shapes with captions, WAV tones with transcripts (numpy), conversations in
JSONL, and a word-level tokenizer trained on them (`tokenizers`); no download."""

from __future__ import annotations

import json
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 210, 40)}
SHAPES = ("circle", "square")
WORDS = ["what", "is", "in", "the", "picture", "a", "an", "sound", "say", "tone", "of", "hertz", "transcribe", "and",
         "show", "here"]  # fmt: skip
# Where a caption sample's image stands in its question: placeholders are expanded in place.
IMAGE_QUESTIONS = (
    "<image>what is in the picture?",
    "what is in the picture? <image>",
    "what is <image> in the picture?",
)


def make_images(folder: Path, sizes: list[tuple[int, int]]) -> list[str]:
    """One PNG per size, a coloured shape on white; returns the file names (relative to `folder`)."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i, (w, h) in enumerate(sizes):
        colour = list(COLOURS)[i % len(COLOURS)]
        shape = SHAPES[i % len(SHAPES)]
        im = Image.new("RGB", (w, h), "white")
        draw = ImageDraw.Draw(im)
        box = (w // 4, h // 4, 3 * w // 4, 3 * h // 4)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
        name = f"img_{i:04d}_{colour}_{shape}.png"
        im.save(folder / name)
        names.append(name)
    return names


def make_tones(folder: Path, seconds: list[float], rate: int = 16000) -> list[str]:
    """One WAV per duration (a sine tone); returns the file names (relative to `folder`)."""
    import numpy as np
    import soundfile

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i, s in enumerate(seconds):
        t = np.arange(int(s * rate)) / rate
        name = f"tone_{i:04d}_{200 + 100 * (i % 4)}hz.wav"
        soundfile.write(folder / name, 0.3 * np.sin(2 * np.pi * (200 + 100 * (i % 4)) * t), rate)
        names.append(name)
    return names


def caption(name: str) -> str:
    _, _, colour, shape = Path(name).stem.split("_")
    return f"a {colour} {shape}"


def make_dataset(root: Path, images: int = 6, tones: int = 4) -> Path:
    """root/data.jsonl: caption samples (an image each, sizes varying, its placeholder before, inside or after
    the question; every sixth from the fifth with two images, every sixth from the sixth with the image in the
    answer), transcription samples (one tone each, before or after the request), one text-only sample; images
    and audio under root/media. Returns the data file."""
    sizes = [(32 + 16 * (i % 3), 24 + 8 * (i % 4)) for i in range(images)]
    imgs = make_images(root / "media", sizes)
    wavs = make_tones(root / "media", [0.5 + 0.25 * i for i in range(tones)])
    lines = []
    for i, name in enumerate(imgs):
        question = IMAGE_QUESTIONS[i % len(IMAGE_QUESTIONS)]
        sample = {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": caption(name)}],
                  "images": [f"media/{name}"]}  # fmt: skip
        if i % 6 == 4:  # two images, each where its placeholder stands
            sample["messages"][0]["content"] = "what is in <image> and in <image>?"
            sample["messages"][1]["content"] = f"{caption(name)} and {caption(imgs[0])}"
            sample["images"].append(f"media/{imgs[0]}")
        elif i % 6 == 5:  # the image in the answer: its last row predicts the caption's first word
            sample["messages"] = [{"role": "user", "content": "show a picture"},
                                  {"role": "assistant", "content": f"here is <image>{caption(name)}"}]  # fmt: skip
        lines.append(sample)
    for i, name in enumerate(wavs):
        hz = Path(name).stem.split("_")[2].removesuffix("hz")
        question = "<audio>transcribe the sound" if i % 2 == 0 else "transcribe the sound <audio>"
        lines.append({"messages": [{"role": "user", "content": question},
                                   {"role": "assistant", "content": f"a tone of {hz} hertz"}],
                      "audios": [f"media/{name}"]})  # fmt: skip
    lines.append({"messages": [{"role": "user", "content": "say a word"}, {"role": "assistant", "content": "tone"}]})
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return data


def make_tokenizer(path: Path, vocab: int = 256) -> Path:
    """A word-level tokenizer over the dataset's words (whitespace and punctuation split), saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [*WORDS, *COLOURS, *SHAPES, *(str(200 + 100 * i) for i in range(4)), "?"]
    tok.train_from_iterator([" ".join(corpus)], trainers.WordLevelTrainer(vocab_size=vocab, special_tokens=["[UNK]"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def main() -> None:
    """`python -m orch.runtime.data.demo_data DIR [--images N --tones N] [--llava DIR]`: DIR/data.jsonl and
    DIR/tok (and a tiny LLaVA directory)."""
    import argparse

    parser = argparse.ArgumentParser(description="Write a small local dataset of captioned shapes and tones.")
    parser.add_argument("folder")
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--tones", type=int, default=24)
    parser.add_argument("--llava", metavar="DIR", help="Also write a tiny LLaVA (HF directory) over the tokenizer.")
    args = parser.parse_args()
    root = Path(args.folder)
    data = make_dataset(root, images=args.images, tones=args.tones)
    tok = make_tokenizer(root / "tok" / "tokenizer.json")
    print(f"wrote {data} ({args.images + args.tones + 1} samples) and {tok}")
    if args.llava:
        from orch.runtime.data.demo_model import make_demo_llava

        print(f"wrote {make_demo_llava(Path(args.llava), tok)} (a LLaVA: CLIP tower, Llama, from a config)")


if __name__ == "__main__":
    main()
