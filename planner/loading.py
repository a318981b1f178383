"""Read spec files and presets into validated models, with errors that name file and field."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orch.planner.errors import SpecError, SpecErrors
from orch.planner.io import read_spec_text
from orch.planner.specs import ClusterSpec, DataSpec, Modality, ModelSpec, TaskSpec

if TYPE_CHECKING:
    from orch.planner.model_dir import Families

SpecT = TypeVar("SpecT", bound=BaseModel)

PRESET_KINDS = {"model": "models", "cluster": "clusters", "data": "data"}
# libyaml's parser where PyYAML was built with it: the safe constructor and resolver, so the same values, parsed
# 10-100x faster than the pure-Python one.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def preset_dir(kind: str) -> Any:
    return resources.files("orch.templates") / PRESET_KINDS[kind]


def preset_names(kind: str) -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in preset_dir(kind).iterdir() if p.name.endswith(".yaml"))


def resolve(kind: str, ref: str) -> tuple[str, str]:
    """Return (source label, YAML text) for a file path or a preset name."""
    path = Path(ref)
    if path.is_file():
        return str(path), read_spec_text(path)
    preset = preset_dir(kind) / f"{ref}.yaml"
    if preset.is_file():
        return f"preset {ref}", preset.read_text()
    names = ", ".join(preset_names(kind))
    raise SpecError(ref, "", f"no such {kind} file or preset; presets: {names}")


def _field_message(err: Any, model: type[BaseModel]) -> tuple[str, str]:
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif err["type"] == "finite_number":
        msg = f"expected a finite number, got {err['input']}"
    elif "input" in err and err["type"] not in ("value_error", "assertion_error"):
        msg = f"{msg} (got {err['input']!r})"
    return loc, msg


def validation_errors(source: str, exc: ValidationError, model: type[BaseModel]) -> SpecErrors:
    return SpecErrors([SpecError(source, *_field_message(e, model)) for e in exc.errors()])


def parse(model: type[SpecT], source: str, data: Any) -> SpecT:
    """Validate already-parsed data, turning pydantic errors into one line per field."""
    if not isinstance(data, dict):
        raise SpecError(source, "", f"expected a mapping of {model.__name__} fields, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_errors(source, exc, model) from None


def _yaml(source: str, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader (above)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise SpecError(source, where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None


def parse_text(model: type[SpecT], source: str, text: str) -> SpecT:
    return parse(model, source, _yaml(source, text))


def load_model(ref: str, families: Families | None = None) -> ModelSpec:
    """A model spec file, a preset, or a Hugging Face model directory; a directory, and a composed spec's module
    naming one, are read through their family in `families` (the runtime's registry, handed in by the caller:
    planner/model_dir.py)."""
    if Path(ref).is_dir():
        from orch.planner.model_dir import read_model_dir

        return read_model_dir(ref, _families(ref, families))
    source, text = resolve("model", ref)
    data = _yaml(source, text)
    modules = data.get("modules") if isinstance(data, dict) else None
    if isinstance(modules, dict) and any(isinstance(m, dict) and "hf" in m for m in modules.values()):
        # A composed spec: modules naming a Hugging Face source take their shapes from its config.json.
        from orch.planner.model_dir import composed_module

        base, table = Path(ref).parent, _families(source, families)
        filled = {
            name: composed_module(name, m, base, source, table) if isinstance(m, dict) and "hf" in m else m
            for name, m in modules.items()
        }
        data = {**data, "modules": filled}
    return parse(ModelSpec, source, data)


def _families(source: str, families: Families | None) -> Families:
    if families is None:
        raise SpecError(source, "", "a Hugging Face model is read through the family registry; none was given")
    return families


def load_cluster(ref: str, nodes: int | None = None) -> ClusterSpec:
    source, text = resolve("cluster", ref)
    spec = parse_text(ClusterSpec, source, text)
    if nodes is not None:
        if nodes <= 0:
            raise SpecError("--nodes", "", f"expected a positive node count, got {nodes}")
        spec = spec.model_copy(update={"nodes": nodes})
    return spec


def load_data(ref: str) -> DataSpec:
    source, text = resolve("data", ref)
    spec = parse_text(DataSpec, source, text)
    if spec.manifest is not None and not Path(spec.manifest).is_absolute():
        base = Path(ref).parent if Path(ref).is_file() else Path(str(preset_dir("data")))
        spec = spec.model_copy(update={"manifest": str((base / spec.manifest).resolve())})
    return spec


def load_json_file(model: type[SpecT], path: str) -> SpecT:
    """Read a JSON or YAML file of `model` (plans, profiles)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(path, "", "no such file")
    text = read_spec_text(p)
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(path, f"line {exc.lineno}", f"not valid JSON: {exc.msg}") from None
        return parse(model, path, data)
    return parse_text(model, path, text)


def check_data_against_model(data: DataSpec, model: ModelSpec, source: str = "data") -> None:
    """Every module a task names must exist in the model."""
    for i, task in enumerate(data.tasks):
        for key in (*task.tokens, *task.max):
            if key not in model.modules:
                raise SpecError(
                    source,
                    f"tasks.{i}.tokens.{key}",
                    f"model '{model.name}' has no module '{key}'; expected one of {sorted(model.modules)}",
                )


# Per-sample tokens of the default mix's task for an encoder of each modality (mean, max) and the LLM text
# that comes with it: a LLaVA-style image (576 patches of a 336-pixel image at 14 px, up to a 4-tile
# high-resolution image) or a Whisper-style clip (1,500 tokens for 30 s of audio, up to two minutes).
_DEFAULT_TASKS = {
    Modality.VISION: ({"mean": 576, "max": 2304}, {"mean": 600, "max": 4096}),
    Modality.AUDIO: ({"mean": 1500, "max": 6000}, {"mean": 900, "max": 4096}),
}
DEFAULT_GLOBAL_BATCH = 256
DEFAULT_SEQ_LEN = 8192


def default_mix(model: ModelSpec) -> DataSpec:
    """The mix a model is planned against when neither `--data` nor the model names one: a text-only
    task (a fifth of the samples) and one task per encoder sharing the rest, with lengths typical of
    its modality (`_DEFAULT_TASKS`; a text encoder takes the vision task's)."""
    encoders = model.encoder_names
    llm = model.llm_name
    tasks = [TaskSpec(name="text", weight=0.2 if encoders else 1.0, tokens={llm: 900}, max={llm: DEFAULT_SEQ_LEN})]
    for name in encoders:
        enc, text = _DEFAULT_TASKS.get(model.modality(name), _DEFAULT_TASKS[Modality.VISION])
        tasks.append(
            TaskSpec(
                name=name,
                weight=0.8 / len(encoders),
                tokens={name: enc["mean"], llm: text["mean"]},
                max={name: enc["max"], llm: text["max"]},
            )
        )
    return DataSpec(
        name=f"default-mix-{model.name}", global_batch=DEFAULT_GLOBAL_BATCH, seq_len=DEFAULT_SEQ_LEN, tasks=tasks
    )


def data_for(model: ModelSpec, data: str | None, action: str = "planned on") -> tuple[DataSpec, str | None]:
    """The data a command plans or profiles on: `--data`, else the model's `data`, else its default mix;
    with the hint line to print when the default mix was taken (None otherwise), saying what was
    `action` ("planned on", "profiling on")."""
    ref = data or model.data
    if ref is not None:
        spec = load_data(ref)
        check_data_against_model(spec, model, ref)
        return spec, None
    spec = default_mix(model)
    kinds = ", ".join(t.name for t in spec.tasks)
    hint = (
        f"the model names no data and no --data was given: {action} a default mix ({kinds}; "
        f"global batch {spec.global_batch}, seq_len {spec.seq_len}); pass --data for yours"
    )
    return spec, hint
