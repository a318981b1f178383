"""What a run, and each of its checkpoints, belongs to: the model's fingerprint, the plan's layouts, the data.

The model's identity is its spec (planner/specs.py ModelSpec) as far as it fixes the tensors a checkpoint
holds and what they compute: every module's architecture fields and a user's model factory. It leaves out
what a run may change and still continue the same model: the spec's name and default data, each module's
`trainable` (LLaVA's stage 2 unfreezes what stage 1 froze), `max_tp` (a planner hint) and the Hugging Face
directory's path (only its tower, `hf.part`, and layers, `hf.feature_layer`). Layouts live in the plan's
modules, not in the spec, so a TP/DP/PP/CP/EP change of the same model keeps the fingerprint and DCP
re-shards the checkpoint onto it. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from orch.planner.plan import Plan
from orch.planner.specs import DataSpec, ModelSpec

_NOT_IDENTITY = ("trainable", "max_tp")  # per module: may change between the runs of one model


def model_identity(model: ModelSpec, model_factory: str | None = None) -> dict[str, Any]:
    """The canonical, layout-free description of the model's tensors (JSON-able)."""
    modules: dict[str, Any] = {}
    for name, spec in sorted(model.modules.items()):
        fields = spec.model_dump(mode="json", exclude=set(_NOT_IDENTITY))
        if fields.get("hf") is not None:
            fields["hf"] = {k: v for k, v in fields["hf"].items() if k != "path"}
        modules[name] = fields
    return {"modules": modules, "model_factory": model_factory}


def fingerprint(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def differences(was: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """`field: X then, Y now` for each leaf that differs (dotted paths, sorted)."""
    out: list[str] = []
    for key in sorted(set(was) | set(now)):
        a, b = was.get(key), now.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(differences(a, b, path + "."))
        elif a != b:
            out.append(f"{path}: {_show(a)} then, {_show(b)} now")
    return out


def _show(value: Any) -> str:
    return "absent" if value is None else json.dumps(value)


def layouts(plan: Plan) -> dict[str, str]:
    """module -> its layout and ranks, as a plan summary writes them ("tp2 dp1 ranks 0-1")."""
    out = {}
    for name, mp in sorted(plan.modules.items()):
        ranks = mp.ranks
        span = f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else ",".join(map(str, ranks))
        out[name] = f"{mp.layout.short()} ranks {span}"
    return out


def data_identity(data: DataSpec) -> dict[str, Any]:
    """Where the batches come from: the data spec without its display name."""
    return data.model_dump(mode="json", exclude={"name"})
