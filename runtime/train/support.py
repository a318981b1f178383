"""What the runtime cannot run yet, refused before any process starts."""

from __future__ import annotations

from orch.planner.errors import OrchError
from orch.planner.plan import Plan
from orch.runtime.models.contract import ExpertBlock
from orch.runtime.parallel.expert import unsupported_ep


class UnsupportedPlan(OrchError):
    pass


def check_supported(plan: Plan) -> None:
    """Raise UnsupportedPlan for a layout the runtime cannot run (one line naming the plan field)."""
    for name, mp in plan.modules.items():
        if mp.layout.pp > 1 and name != plan.model.llm_name:
            raise UnsupportedPlan(f"modules.{name}.layout.pp: {mp.layout.pp}: only the LLM runs pipeline stages")
        spec = plan.model.modules[name]
        for axis in ("tp", "cp", "pp"):
            degree = getattr(mp.layout, axis)
            refused = spec.refuses(axis, degree)
            if refused is not None:
                raise UnsupportedPlan(f"modules.{name}.layout.{axis}: {degree}: {refused}")
        why = unsupported_ep(name, mp, plan.model.modules[name].experts, name == plan.model.llm_name)
        if why is not None:
            raise UnsupportedPlan(why)
    for e in plan.model.encoder_names:
        if not any(edge.src == e and edge.dst == plan.model.llm_name for edge in plan.edges):
            raise UnsupportedPlan(f"edges: no edge from {e} to {plan.model.llm_name}")


def check_hf_plan(plan: Plan) -> None:
    """For a model of Hugging Face modules, what the ranks would refuse, found before any starts: unreadable
    configs, safetensors whose names or shapes do not match, and layouts the HF modules do not take."""
    from orch.runtime.models.hf.build import build_hf_modules

    modules = build_hf_modules(plan.model)
    for name, module in modules.items():
        layout = plan.modules[name].layout
        if layout.ep > 1 and not any(isinstance(m, ExpertBlock) for m in module.modules()):
            raise UnsupportedPlan(f"modules.{name}.layout.ep: {layout.ep}: the module has no Mixture-of-Experts blocks")
        if getattr(module, "tied", False):  # a plan file written before specs recorded tied_embeddings
            tied = plan.model.modules[name].model_copy(update={"tied_embeddings": True})
            refused = tied.refuses("pp", layout.pp)
            if refused is not None:
                raise UnsupportedPlan(f"modules.{name}.layout.pp: {layout.pp}: {refused}")
