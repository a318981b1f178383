"""Data for the Qwen-VL tests: the model spec of a tiny Qwen-VL directory (qwen_vl_models.py), images and
videos written with Pillow and PyAV, and conversation files in LLaMA-Factory's layout."""

import json
from pathlib import Path

from orch.planner.specs import ModelSpec


def hf_images(directory, **kwargs):
    """HF's PIL Qwen2-VL image processor of a directory."""
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.Qwen2VLImageProcessorPil.from_pretrained(directory, **kwargs)


def hf_auto_images(directory):
    """The directory's image processor as HF's AutoImageProcessor (a user's AutoProcessor) picks it: torchvision's
    backend where torchvision is installed, else the PIL one."""
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.AutoImageProcessor.from_pretrained(directory)


def hf_processor(directory, cls: str = "Qwen2_5_VLProcessor"):
    """HF's processor `cls` of the directory's image processor (as AutoImageProcessor picks it) and tokenizer (its
    video processor needs torchvision, absent here: the processor is built without one)."""
    import transformers

    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    check = transformers.ProcessorMixin.check_argument_for_proper_class
    transformers.ProcessorMixin.check_argument_for_proper_class = lambda self, name, arg: None  # type: ignore
    try:
        return getattr(transformers, cls)(image_processor=hf_auto_images(directory), tokenizer=tokenizer)
    finally:
        transformers.ProcessorMixin.check_argument_for_proper_class = check  # type: ignore


def qwen_vl_spec(directory: Path) -> ModelSpec:
    """The spec the planner's config reader gives a tiny Qwen-VL directory (`--model DIR`)."""
    from orch.runtime.models.registry import model_spec_from_dir

    return model_spec_from_dir(directory)


def write_image(path: Path, width: int, height: int, seed: int = 0) -> Path:
    """A noisy RGB PNG of width x height."""
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return path


def write_video(
    path: Path, frames: int, width: int = 64, height: int = 48, rate: int = 4, codec: str = "mpeg4", same: bool = False
) -> Path:
    """A video of `frames` frames at `rate` fps (a moving gradient, or one frame repeated where `same`), written
    with PyAV."""
    import av
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(frames * 1000 + width)
    base = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width, stream.height = width, height
        stream.pix_fmt = "rgb24" if codec in ("libx264rgb", "png", "qtrle") else "yuv420p"
        if codec == "libx264rgb":
            stream.options = {"crf": "0", "preset": "ultrafast"}
        for i in range(frames):
            pixels = base if same else np.roll(base, 3 * i, axis=1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def write_conversations(path: Path, records: list[dict]) -> Path:
    """A JSONL data file of `records`."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def turn(user: str, answer: str = "a red circle", **media) -> dict:
    """One LLaMA-Factory record: a user turn (with its placeholders), the answer, and media lists."""
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}], **media}
