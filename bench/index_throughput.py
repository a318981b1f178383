"""Index speed for the Qwen-VL family: `orch data index` on a JSONL of conversations with images and videos, the
token rule reading only headers (Pillow's lazy open for image sizes, PyAV's container header for a video's
frames, rate and size: no pixel decoded), on one core, cold (no cached index).

    python bench/index_throughput.py [--samples N] [--files F]     (writes bench/out/index_throughput.json)

A few hundred distinct small images and videos (F of each kind), referenced many times: a third of the samples
with an image, a third with a video, a sixth with two images and a video, the rest text. Baseline in the same
run: the same file's JSON parsing and text tokenization alone; and the headers alone (each file read once).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from orch.runtime.data.conversations import read_conversations
from orch.runtime.data.index import TextCounter, build_index, find_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--files", type=int, default=200, help="distinct images and distinct videos")
    args = parser.parse_args()
    from qwen_vl_data import qwen_vl_spec, write_image, write_video
    from qwen_vl_models import make_qwen_vl

    from orch.runtime.models.qwen_vl.media import read_rule

    n, files = args.samples, args.files
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        directory = make_qwen_vl(root / "model", "qwen2_5_vl")
        model = qwen_vl_spec(directory)
        images = [write_image(root / "media" / f"i{k}.png", 32 + 7 * (k % 40), 24 + 5 * (k % 30), seed=k).name
                  for k in range(files)]  # fmt: skip
        videos = [write_video(root / "media" / f"v{k}.mp4", frames=4 + k % 12, width=32 + 8 * (k % 6),
                              height=32 + 8 * (k % 4), rate=4 + k % 5).name for k in range(files)]  # fmt: skip
        made = time.perf_counter() - t
        lines = []
        for i in range(n):
            kind = i % 6
            img, vid = f"media/{images[(i * 7) % files]}", f"media/{videos[(i * 11) % files]}"
            rec: dict = {
                "messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "a red circle"}]
            }
            if kind in (0, 1):
                rec["messages"][0]["content"], rec["images"] = "<image>what is in the picture?", [img]
            elif kind in (2, 3):
                rec["messages"][0]["content"], rec["videos"] = "<video>what happens?", [vid]
            elif kind == 4:
                rec["messages"][0]["content"] = "<image>this<video>then<image>and?"
                rec["images"], rec["videos"] = [img, f"media/{images[(i * 13) % files]}"], [vid]
            else:
                rec["messages"][0]["content"] = "say a word"
            lines.append(json.dumps(rec))
        data = root / "data.jsonl"
        data.write_text("\n".join(lines) + "\n")
        t = time.perf_counter()
        convs = list(read_conversations(str(data)))
        TextCounter(*find_tokenizer(model, None)).count(convs)  # type: ignore[arg-type]
        base = time.perf_counter() - t
        rule = read_rule(str(directory), "qwen2_5_vl")
        t = time.perf_counter()
        for k in range(files):
            rule.image_item(str(root / "media" / images[k]))
            rule.video_item(str(root / "media" / videos[k]))
        headers = time.perf_counter() - t
        t = time.perf_counter()
        idx = build_index(str(data), model)
        full = time.perf_counter() - t
        t = time.perf_counter()
        build_index(str(data), model)
        cached = time.perf_counter() - t
    refs = sum(1 for i in range(n) if i % 6 != 5) + sum(1 for i in range(n) if i % 6 == 4) * 2
    print(f"{n} samples, {refs} media references to {files} images and {files} videos, one process")
    print(f"(inputs written in {made:.1f} s)")
    print(f"{'pass':40s} {'seconds':>8s} {'samples/s':>10s}")
    print(f"{'parse + tokenize (baseline)':40s} {base:8.2f} {n / base:10.0f}")
    print(f"{'headers alone (each file once)':40s} {headers:8.2f} {2 * files / headers:10.0f} files/s")
    print(f"{'orch data index (cold)':40s} {full:8.2f} {n / full:10.0f}")
    print(f"{'orch data index (cached)':40s} {cached:8.2f} {n / cached:10.0f}")
    out = {"samples": n, "indexed": idx.samples, "bad": len(idx.bad), "files": files, "references": refs,
           "baseline_s": base, "headers_s": headers, "header_files_per_s": 2 * files / headers,
           "index_s": full, "samples_per_s": n / full, "cached_s": cached}  # fmt: skip
    folder = Path(__file__).parent / "out"
    folder.mkdir(exist_ok=True)
    (folder / "index_throughput.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
