"""`orch plan`: specs in, the best per-module layout and placement out."""

from __future__ import annotations

from typing import Any

import typer

from orch.cli.data_cmd import AUDIO_IN_VIDEO_HELP, INDEX_DIR_HELP, MEDIA_ROOT_HELP, MODEL_HELP
from orch.cli.output import console, print_json

PLACEMENTS = ("auto", "homogeneous", "colocated", "disaggregated")


def plan(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    cluster: str = typer.Option(..., "--cluster", "-c", help="Cluster spec file or preset."),
    nodes: int | None = typer.Option(None, "--nodes", "-n", help="Override the cluster's node count."),
    data: str | None = typer.Option(
        None,
        "--data",
        "-d",
        help="Conversation data (a file, mix file, directory, or dataset_info.json:NAME[,NAME]), "
        "or a data spec file or preset (default: the model's).",
    ),
    profile: str | None = typer.Option(None, "--profile", help="Measured costs from `orch profile`."),
    out: str = typer.Option("plan.yaml", "--out", "-o", help="Where to write the plan (YAML)."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON on stdout."),
    placement: str = typer.Option("auto", "--placement", help=f"One of {', '.join(PLACEMENTS)}."),
    fix: list[str] = typer.Option([], "--fix", help="Pin a degree: MODULE.AXIS=N (tp, cp, pp, dp, ep, gpus)."),
    trace: str | None = typer.Option(None, "--trace", help="Write the predicted step as a Chrome trace JSON."),
    top: int = typer.Option(4, "--top", help="Alternatives to list beside the best plan."),
    time_limit: float = typer.Option(10.0, "--time-limit", help="CP-SAT time limit, seconds."),
    global_batch: int | None = typer.Option(None, "--global-batch", help="Samples per step (overrides the data's)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Cap on LLM tokens per sample (overrides the data's)."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="tokenizer.json for a data file (reference model)."),
    index_dir: str | None = typer.Option(None, "--index-dir", help=INDEX_DIR_HELP),
    media_root: str | None = typer.Option(None, "--media-root", help=MEDIA_ROOT_HELP),
    use_audio_in_video: bool = typer.Option(False, "--use-audio-in-video", help=AUDIO_IN_VIDEO_HELP),
    data_parallel: str = typer.Option(
        "auto", "--data-parallel", help="fsdp, replicate, or auto (fsdp unless a module is small)."
    ),
    sharding: list[str] = typer.Option(
        [],
        "--sharding",
        help="An fsdp module's: keep (gathered for the step), reshard (ZeRO-3: per block call), or auto "
        "(default: the search weighs reshard's memory against its gathers where memory binds); MODE for every "
        "module or MODULE=MODE for one (repeatable).",
    ),
) -> None:
    """Choose TP/CP/PP/DP/EP per module and the placement, and write the plan."""
    from orch.planner.candidates import Pin, SearchInput
    from orch.planner.costs import CostConfig
    from orch.planner.errors import SpecError
    from orch.planner.io import to_yaml, write_text_atomic
    from orch.planner.loading import load_cluster, load_json_file
    from orch.planner.plan import DataParallel, Placement
    from orch.planner.planner import make_plan
    from orch.planner.profile import Profile
    from orch.planner.search import SolverConfig
    from orch.runtime.models.registry import load_model

    modes = ("auto", *(d.value for d in DataParallel))
    if data_parallel not in modes:
        raise SpecError("--data-parallel", "", f"expected one of {', '.join(modes)}, got '{data_parallel}'")
    if placement not in PLACEMENTS:
        raise SpecError("--placement", "", f"expected one of {', '.join(PLACEMENTS)}, got '{placement}'")
    model_spec = load_model(model)
    notes = []  # printed once the plan is written: a reader that stops early (`| head`) still gets the plan
    if any(m.hf is not None for m in model_spec.modules.values()):
        from orch.planner.hf_config import describe

        notes += [f"config.json: {line}" for line in describe(model_spec)]
    cluster_spec = load_cluster(cluster, nodes)
    from orch.cli.data_cmd import data_spec_for

    data_spec, hint = data_spec_for(
        model_spec, data, "planned on", global_batch, seq_len, tokenizer, index_dir, media_root, use_audio_in_video
    )
    if hint is not None:
        notes.append(f"hint: {hint}")
    every_sharding, sharding_of = _shardings(sharding, model_spec)
    prof = load_json_file(Profile, profile) if profile else None
    pins = tuple(Pin.parse(f, model_spec) for f in fix)
    placements = tuple(Placement) if placement == "auto" else (Placement(placement),)
    costs = CostConfig(
        data_parallel=None if data_parallel == "auto" else DataParallel(data_parallel),
        sharding=every_sharding,
        sharding_of=sharding_of,
    )
    inp = SearchInput(model_spec, cluster_spec, data_spec, profile=prof, pins=pins, placements=placements, cfg=costs)
    result = make_plan(inp, SolverConfig(time_limit_s=time_limit, alternatives=max(top, 0)))

    write_text_atomic(out, to_yaml(result.model_dump(mode="json")))
    if trace:
        from orch.planner.trace import trace_json

        write_text_atomic(trace, trace_json(result))
    from rich.markup import escape

    for note in notes:
        console().print(escape(note))
    if json_out:
        print_json(result)
        return
    from orch.cli.plan_render import render_plan

    render_plan(console(), result)
    console().print(f"plan written to [bold]{out}[/]" + (f", trace to [bold]{trace}[/]" if trace else ""))


def register(app: typer.Typer) -> None:
    app.command()(plan)


def _shardings(items: list[str], model: Any) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    """`--sharding` values: (every module's, or None for auto; per module (name, sharding)); one clear error."""
    from orch.planner.errors import SpecError
    from orch.planner.plan import Sharding

    modes = ("auto", *(x.value for x in Sharding))
    every = None
    per: dict[str, Sharding] = {}
    for item in items:
        module, eq, mode = item.rpartition("=")
        if mode not in modes:
            raise SpecError("--sharding", item, f"expected one of {', '.join(modes)} or MODULE=MODE, got '{mode}'")
        if eq and module not in model.modules:
            raise SpecError("--sharding", item, f"no module '{module}'; expected one of {sorted(model.modules)}")
        chosen = None if mode == "auto" else Sharding(mode)
        if eq:
            if chosen is not None:
                per[module] = chosen
        else:
            every = chosen
    return every, tuple(sorted(per.items()))
