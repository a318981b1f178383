"""Cost model: FLOPs, parameters, memory and time of one module under one layout."""

from __future__ import annotations

from orch.planner.specs import ModuleSpec


def layer_params(m: ModuleSpec, active: bool = False) -> float:
    """Parameters of one transformer block (active=True: the experts a token actually uses)."""
    h = m.hidden
    attn = 2 * h * h + 2 * h * m.num_kv_heads * m.head_dim
    mlp_one = (3 if m.mlp_kind == "swiglu" else 2) * h * m.ffn
    experts = m.top_k if active else m.experts
    router = h * m.experts if m.experts > 1 else 0
    return attn + experts * mlp_one + router + 2 * h


def module_params(m: ModuleSpec) -> float:
    embed = 2 * m.vocab * m.hidden if m.vocab else 0
    stem = (m.input_dim or 0) * m.hidden
    return m.layers * layer_params(m) + embed + stem
