"""Index speed: `orch data index` on a JSONL of conversations, each with an image or an audio clip (a third
with neither), every file distinct (its header read once per sample), on one core, cold (no cached index).

    python bench/bench_data_index.py [--samples N]          (writes bench/out/data_index.json)

Baseline in the same run: the same file's JSON parsing and text tokenization alone (no headers).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from orch.runtime.data.conversations import read_conversations
from orch.runtime.data.demo_data import make_images, make_tokenizer, make_tones
from orch.runtime.data.index import TextCounter, build_index
from orch.runtime.models.registry import load_model

CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"  # Qwen2's turn markup, without its default system prompt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20000)
    args = parser.parse_args()
    n = args.samples
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        images = make_images(root / "media", [(32 + i % 64, 24 + i % 48) for i in range(n // 3)])
        tones = make_tones(root / "media", [0.1 + 0.01 * (i % 50) for i in range(n // 3)])
        lines = []
        for i in range(n):
            kind = i % 3
            turn = "<image>what is in the picture?" if kind == 0 else "<audio>transcribe" if kind == 1 else "say a word"
            rec = {"messages": [{"role": "user", "content": turn}, {"role": "assistant", "content": "a red circle"}]}
            if kind == 0:
                rec["images"] = [f"media/{images[(i // 3) % len(images)]}"]
            elif kind == 1:
                rec["audios"] = [f"media/{tones[(i // 3) % len(tones)]}"]
            lines.append(json.dumps(rec))
        data = root / "data.jsonl"
        data.write_text("\n".join(lines) + "\n")
        tok = make_tokenizer(root / "tok" / "tokenizer.json")
        model = load_model("tiny")
        t = time.perf_counter()
        convs = [c for c in read_conversations(str(data))]
        TextCounter(str(tok), None).count(convs)  # type: ignore[arg-type]
        base = time.perf_counter() - t
        t = time.perf_counter()
        idx = build_index(str(data), model, str(tok))
        full = time.perf_counter() - t
        templated = root / "tok-chat"
        templated.mkdir()
        (templated / "tokenizer.json").write_text(tok.read_text())
        (templated / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
        t = time.perf_counter()
        build_index(str(data), model, str(templated))
        chat = time.perf_counter() - t
    print(f"{n} samples (a third with an image, a third with a clip), one process")
    print(f"{'pass':34s} {'seconds':>8s} {'samples/s':>10s}")
    print(f"{'parse + tokenize (baseline)':34s} {base:8.2f} {n / base:10.0f}")
    print(f"{'orch data index (with headers)':34s} {full:8.2f} {n / full:10.0f}")
    print(f"{'  ... and a ChatML chat template':34s} {chat:8.2f} {n / chat:10.0f}")
    out = {"samples": n, "indexed": idx.samples, "baseline_s": base, "index_s": full, "samples_per_s": n / full,
           "chat_template_s": chat, "chat_template_samples_per_s": n / chat}  # fmt: skip
    folder = Path(__file__).parent / "out"
    folder.mkdir(exist_ok=True)
    (folder / "data_index.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
