"""`orch export`: a run's checkpoint gathered back into Hugging Face directories, loadable with `from_pretrained`.

The checkpoint (runtime/workdir/checkpoint.py, DCP) holds each module's parameters under orch's names; every
HF module knows its parameters' names in the transformers model (`HFModule.hf_keys`). Per source
directory: the full tensors in one process (DCP resharded into plain tensors), renamed, written in the
layout `save_pretrained` writes (transformers' own `revert_weight_conversion`), cast to the source's
dtype, beside a copy of the source's other files (config, tokenizer, processor). Written into a
temporary directory and renamed, so a directory that exists is complete. The projectors orch builds
for a composed spec belong to no source: they go to `projectors.safetensors`, keyed module.parameter.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError
from orch.planner.plan import Plan

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
PROJECTORS = "projectors.safetensors"  # orch's own parameters of a composed spec, "module.parameter" keyed


def read_checkpoint(step_dir: Path) -> dict[str, Any]:
    """The whole DCP checkpoint as nested plain tensors, in this process (its metadata read without pickle)."""
    from orch.runtime.workdir.checkpoint_metadata import read_whole

    return read_whole(step_dir)


def source_dtype(directory: Path) -> Any:
    """The dtype the source's config.json names (`dtype`, or the older `torch_dtype`), else None."""
    import torch

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    name = config.get("dtype") or config.get("torch_dtype")
    return getattr(torch, name, None) if isinstance(name, str) else None


def export_run(run_dir: str | Path, out: str | Path, step: int | None = None) -> list[Path]:
    """Write one HF directory per source of the run's model (one source: `out` itself; several: out/<modules>),
    and a composed spec's projectors as out/projectors.safetensors; returns what was written."""
    import torch
    from safetensors.torch import load_file, save_file

    from orch.planner.loading import load_json_file
    from orch.runtime.models.hf.build import build_full, build_hf_modules
    from orch.runtime.models.hf.weights import Checkpoint
    from orch.runtime.workdir.checkpoint_manifest import verify
    from orch.runtime.workdir.run_dir import PLAN_FILE, checkpoint_root, choose_checkpoint, step_name

    run = Path(run_dir)
    plan = load_json_file(Plan, str(run / PLAN_FILE))
    if step is None:
        found = choose_checkpoint(run, None)  # plan.json is this run's own: its checkpoints are its model's
        if found is None:
            raise SpecError(str(run), "checkpoints", "no checkpoint (a run saves one when it ends)")
        step = found.step
    step_dir = checkpoint_root(run) / step_name(step)
    if not step_dir.is_dir():
        raise SpecError(str(run), "--step", f"no checkpoint of step {step}")
    problem = verify(step_dir)
    if isinstance(problem, str) and problem != "no manifest.json":
        raise SpecError(str(step_dir), "", f"{problem}: not exported")
    sources: dict[str, list[str]] = {}
    for name, spec in plan.model.modules.items():
        if spec.hf is None:
            raise SpecError(str(run / PLAN_FILE), f"model.modules.{name}.hf", "export writes Hugging Face modules only")
        sources.setdefault(spec.hf.path, []).append(name)
    state = read_checkpoint(step_dir)
    modules = build_hf_modules(plan.model)
    written = []
    own = {
        f"{n}.{local}": state[n]["model"][local].contiguous()
        for n, m in modules.items()
        for local in sorted(m.own_names)
    }
    if own:  # a composed spec's projectors: orch's modules, not any source's
        Path(out).mkdir(parents=True, exist_ok=True)
        tmp = Path(out) / f".{PROJECTORS}.tmp"
        save_file(own, str(tmp), metadata={"format": "pt"})
        tmp.rename(Path(out) / PROJECTORS)
        written.append(Path(out) / PROJECTORS)
    for path, names in sources.items():
        src = Path(path)
        target = Path(out) if len(sources) == 1 else Path(out) / "+".join(names)
        dtype = source_dtype(src)
        full = build_full(path)
        shapes = {k: v.shape for k, v in full.state_dict().items()}
        weights: dict[str, torch.Tensor] = {}
        for name in names:
            saved = state[name]["model"]
            for local, key in modules[name].hf_keys.items():
                tensor = saved[local]  # a tied weight is saved under its first name, the one hf_keys holds
                tensor = tensor.reshape(shapes[key])  # a fused qkv held by group (hf/fused_qkv.py) back as HF's
                weights[key] = (tensor.to(dtype) if dtype is not None else tensor).contiguous()
        from transformers.core_model_loading import revert_weight_conversion

        on_disk = revert_weight_conversion(full, weights)
        # What the run never held (a Whisper source's decoder) comes back from the source as it was.
        ckpt = Checkpoint.of(src, full)
        untouched = [loc for name, loc in (ckpt.tensors.items() if ckpt else []) if name not in weights]
        for file in {loc.file for loc in untouched}:
            stored = load_file(str(file))
            for loc in untouched:
                if loc.file == file:
                    on_disk.setdefault(loc.key, stored[loc.key])
        write_directory(src, target, {k: v.contiguous() for k, v in on_disk.items()}, save_file)
        written.append(target)
    return written


def is_weights_file(name: str) -> bool:
    """A file of the model's weights (written anew), not one the directory keeps as it is (a tokenizer, a
    processor config, Qwen2.5-Omni's `spk_dict.pt`, the voices its talker speaks in)."""
    if name.endswith(".safetensors") or name in INDEX_NAMES:
        return True
    return name.endswith(WEIGHT_SUFFIXES) and name.startswith(("pytorch_model", "model", "tf_model"))


def write_directory(src: Path, target: Path, weights: dict[str, Any], save_file: Any) -> None:
    """target/: model.safetensors and every non-weight file of src, atomically (a temporary sibling, renamed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for f in src.iterdir():
            if f.is_file() and not is_weights_file(f.name):
                shutil.copy2(f, tmp / f.name)
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
