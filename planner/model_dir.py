"""A Hugging Face model directory, or a composed spec's module naming one, read into specs through its family.

The planner names no family: which `model_type` is which family is the runtime's registry
(runtime/models/registry.py), and each family reads its own config.json (its folder's reader, torch-free). The
dependency runs `cli -> runtime -> planner` only, so the caller hands the registry in: `families` below is any
mapping of model_type to a `ConfigReader` (docs/model_families.md, docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig, read_config, ties_embeddings
from orch.planner.specs import ModelSpec, ModuleKind, ModuleSpec


class Role(StrEnum):
    MODEL = "model"  # `--model DIR` alone gives every module (a multimodal model)
    LLM = "llm"  # a language model: `--model DIR` alone (text only), or a composed spec's llm
    TOWER = "tower"  # an encoder source of a composed spec (orch builds its projector)


class ConfigReader(Protocol):
    """What the planner asks of a family: its config.json read into modules, without torch."""

    model_type: str
    role: Role

    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        """A whole directory (a MODEL or an LLM family): {module name: spec}, each naming its `hf` part."""
        ...

    def read_source(
        self, top: HFConfig, directory: str, ref: dict[str, Any], rest: dict[str, Any], where: str, source: str
    ) -> ModuleSpec:
        """A composed spec's module from this directory (a TOWER or an LLM family). `ref`: its `hf` mapping;
        `rest`: the entry's other fields, from which the family takes out those it reads itself."""
        ...


Families = Mapping[str, ConfigReader]


def types_of(families: Families, *roles: Role) -> tuple[str, ...]:
    """The model_types of the families in `roles`, role by role in the order given, each in registry order."""
    return tuple(t for role in roles for t, f in families.items() if f.role == role)


def family_of(families: Families, model_type: str | None, source: str, field: str, *roles: Role) -> ConfigReader:
    """The family of a config's model_type among `roles`; SpecError naming the supported ones otherwise."""
    allowed = types_of(families, *roles)
    if model_type not in allowed:
        raise SpecError(source, field, f"'{model_type}' is not supported; expected one of {', '.join(allowed)}")
    return families[model_type]


def read_model_dir(directory: str | Path, families: Families) -> ModelSpec:
    """The ModelSpec of a Hugging Face model directory (its modules carry `hf` so the runtime builds them), by its
    family's reader."""
    path = str(Path(directory).resolve())
    source, raw = read_config(directory)
    top = HFConfig(source, "", raw)
    family = family_of(families, top.model_type, source, "model_type", Role.MODEL, Role.LLM)
    modules = family.read(top, path)
    if ties_embeddings(raw):
        modules = {n: m.model_copy(update={"tied_embeddings": m.kind == ModuleKind.LLM}) for n, m in modules.items()}
    try:
        return ModelSpec(name=Path(path).name, modules=modules)
    except ValidationError as exc:  # a shape the readers do not check field by field: one line, not a traceback
        err = exc.errors()[0]
        raise SpecError(source, "", str(err["msg"]).removeprefix("Value error, ")) from None


# What a composed spec's module takes from its hf source; the spec may not set these itself.
DERIVED = ("kind", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "mlp", "vocab", "input_dim",
           "image_tokens", "clip_tokens", "experts", "top_k", "tied_embeddings")  # fmt: skip


def composed_module(name: str, entry: dict[str, Any], base: Path, source: str, families: Families) -> dict[str, Any]:
    """A composed spec's module entry naming `hf` (a directory, relative to the spec file, or a mapping with
    path, part and feature_layer) with the fields its config.json gives filled in, by the source's family: a
    bare tower (an encoder, with a projector built by orch) or a language model."""
    where = f"modules.{name}"
    ref = entry["hf"]
    if isinstance(ref, str):
        ref = {"path": ref}
    if not isinstance(ref, dict) or not isinstance(ref.get("path"), str):
        raise SpecError(source, f"{where}.hf", "expected a model directory, or a mapping with path")
    unknown = sorted(set(ref) - {"path", "part", "feature_layer"})
    if unknown:
        raise SpecError(source, f"{where}.hf.{unknown[0]}", "unknown field; expected path, part, feature_layer")
    for key in DERIVED:
        if key in entry:
            raise SpecError(source, f"{where}.{key}", "comes from the hf source's config.json; remove it")
    path = Path(ref["path"])
    directory = (path if path.is_absolute() else base / path).resolve()
    config_path, raw = read_config(directory)
    top = HFConfig(config_path, "", raw)
    family = family_of(families, top.model_type, config_path, "model_type", Role.TOWER, Role.LLM)
    rest = {k: v for k, v in entry.items() if k != "hf"}
    wants_encoder = "feeds" in entry
    if wants_encoder == (family.role == Role.LLM):
        role, need = (
            ("an encoder", ", ".join(types_of(families, Role.TOWER)))
            if wants_encoder
            else ("the llm", ", ".join(types_of(families, Role.LLM)))
        )
        raise SpecError(
            source, f"{where}.hf", f"{directory} holds a {family.model_type} model; {role} needs one of {need}"
        )
    spec = family.read_source(top, str(directory), ref, rest, where, source)
    return {**spec.model_dump(exclude_none=True), **{k: v for k, v in rest.items() if v is not None}}
