"""What the runtime cannot run yet, refused before any process starts."""

from __future__ import annotations

from orch.planner.errors import OrchError
from orch.planner.plan import Plan
from orch.runtime.parallel.expert import unsupported_ep


class UnsupportedPlan(OrchError):
    pass


def check_supported(plan: Plan) -> None:
    """Raise UnsupportedPlan for a layout the runtime cannot run (one line naming the plan field)."""
    for name, mp in plan.modules.items():
        if mp.layout.pp > 1 and name != plan.model.llm_name:
            raise UnsupportedPlan(f"modules.{name}.layout.pp: {mp.layout.pp}: only the LLM runs pipeline stages")
        spec = plan.model.modules[name]
        if spec.max_tp is not None and mp.layout.tp > spec.max_tp:
            raise UnsupportedPlan(
                f"modules.{name}.layout.tp: {mp.layout.tp}: this module takes tensor parallelism up to {spec.max_tp} "
                "(a native-resolution tower's fused qkv projection is not sharded)"
            )
        if not spec.splits_over(mp.layout.tp):
            raise UnsupportedPlan(
                f"modules.{name}.layout.tp: {mp.layout.tp} does not split {spec.heads} heads, "
                f"{spec.num_kv_heads} KV heads and FFN {spec.ffn} evenly"
            )
        if spec.windowed and mp.layout.cp > 1:
            raise UnsupportedPlan(
                f"modules.{name}.layout.cp: {mp.layout.cp}: a tower of fixed windows (whole images, audio clips, "
                "a native-resolution tower's images) attends within each and takes no context parallelism"
            )
        layers = spec.layers
        if mp.layout.pp > layers:
            raise UnsupportedPlan(f"modules.{name}.layout.pp: {mp.layout.pp} stages for {layers} layers")
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
        if layout.ep > 1:
            raise UnsupportedPlan(f"modules.{name}.layout.ep: {layout.ep}: the HF families orch builds are dense")
        if getattr(module, "tied", False) and layout.pp > 1:  # a decoder tying its embedding and head
            raise UnsupportedPlan(
                f"modules.{name}.layout.pp: {layout.pp}: the model ties its embedding and head "
                "(tie_word_embeddings), which a pipeline would split over two stages"
            )
