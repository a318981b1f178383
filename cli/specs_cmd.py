"""`orch presets` and `orch schema`: what ships, and the JSON Schemas of every file orch reads."""

from __future__ import annotations

import json

import typer

from orch.cli.output import console, print_json_text

SCHEMAS = ("model", "cluster", "data", "plan", "profile", "batch", "metrics", "train")


def presets(json_out: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """List the built-in model, cluster and data presets."""
    from orch.planner.loading import PRESET_KINDS, load_cluster, load_data, preset_names
    from orch.runtime.models.registry import load_model

    loaders = {"model": load_model, "cluster": load_cluster, "data": load_data}
    rows = []
    for kind in PRESET_KINDS:
        for name in preset_names(kind):
            spec = loaders[kind](name)
            rows.append({"kind": kind, "name": name, "summary": _summary(kind, spec)})
    if json_out:
        print_json_text(json.dumps(rows, indent=2))
        return
    from orch.cli.output import table

    t = table(
        "orch presets (use the name with --model / --cluster / --data)",
        [("kind", "name"), ("name", "name"), ("summary", "text")],
    )
    for r in rows:
        t.add_row(r["kind"], r["name"], r["summary"])
    console().print(t)


def _summary(kind: str, spec: object) -> str:
    from orch.planner.costs import module_params
    from orch.planner.specs import ClusterSpec, DataSpec, ModelSpec

    if kind == "model":
        assert isinstance(spec, ModelSpec)
        parts = [f"{n} {module_params(m) / 1e9:.2f}B" for n, m in spec.modules.items()]
        return ", ".join(parts)
    if kind == "cluster":
        assert isinstance(spec, ClusterSpec)
        return (
            f"{spec.nodes}x{spec.gpus_per_node} GPUs, {spec.gpu.memory_gb:g} GB, {spec.gpu.peak_tflops:g} TFLOP/s, "
            f"{spec.links.intra_node_gbps:g}/{spec.links.inter_node_gbps:g} GB/s intra/inter (--nodes N)"
        )
    assert isinstance(spec, DataSpec)
    names = ", ".join(t.name or "?" for t in spec.tasks)
    return f"batch {spec.global_batch}, seq {spec.seq_len}: {names}"


def schema(
    kind: str = typer.Argument(..., help=f"one of: {', '.join(SCHEMAS)}"),
) -> None:
    """Print the JSON Schema of a file orch reads."""
    from orch.planner.errors import SpecError

    if kind not in SCHEMAS:
        raise SpecError("schema", "kind", f"expected one of {', '.join(SCHEMAS)}, got '{kind}'")
    model = _schema_model(kind)
    print_json_text(json.dumps(model.model_json_schema(), indent=2))


def _schema_model(kind: str) -> type:
    from orch.planner import plan, profile, specs

    if kind == "batch":
        from orch.planner.balance.batch import Batch

        return Batch
    if kind == "metrics":
        from orch.runtime.workdir.metrics import StepRecord

        return StepRecord
    if kind == "train":
        from orch.runtime.train.config import TrainSpec

        return TrainSpec
    return {
        "model": specs.ModelSpec,
        "cluster": specs.ClusterSpec,
        "data": specs.DataSpec,
        "plan": plan.Plan,
        "profile": profile.Profile,
    }[kind]


def register(app: typer.Typer) -> None:
    app.command()(presets)
    app.command()(schema)
