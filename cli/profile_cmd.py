"""`orch profile` (measure this cluster into a profile file) and `orch validate` (predicted vs measured).

torch and the runtime are imported inside the commands so `orch --help` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orch.cli.data_cmd import AUDIO_IN_VIDEO_HELP, INDEX_DIR_HELP, MEDIA_ROOT_HELP, MODEL_HELP

if TYPE_CHECKING:
    from orch.planner.profile import Profile
    from orch.planner.specs import ClusterSpec, ModelSpec
    from orch.runtime.profile.cases import ProfileConfig
    from orch.runtime.profile.validate import Validation

EXECUTORS = ("local", "slurm")


def profile(
    model: str = typer.Option(..., "--model", "-m", help=f"{MODEL_HELP[:-1]}: its modules are timed."),
    executor: str = typer.Option("local", "--executor", help=f"One of {', '.join(EXECUTORS)}."),
    nproc: int = typer.Option(4, "--nproc", help="Local processes, all benchmarking at once as training runs."),
    nodes: int | None = typer.Option(None, "--nodes", help="Slurm nodes (--executor slurm)."),
    cluster: str = typer.Option("local-cpu", "--cluster", "-c", help="Cluster spec: its GPUs per node group ranks."),
    data: str | None = typer.Option(
        None, "--data", "-d", help="Data file or mix, or a data spec file or preset (default: the model's)."
    ),
    global_batch: int | None = typer.Option(None, "--global-batch", help="Samples per step (overrides the data's)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Cap on LLM tokens per sample (overrides the data's)."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="tokenizer.json for a data file (reference model)."),
    index_dir: str | None = typer.Option(None, "--index-dir", help=INDEX_DIR_HELP),
    media_root: str | None = typer.Option(None, "--media-root", help=MEDIA_ROOT_HELP),
    use_audio_in_video: bool = typer.Option(False, "--use-audio-in-video", help=AUDIO_IN_VIDEO_HELP),
    quick: bool = typer.Option(
        False, "--quick", help="Fewer lengths, sizes and repetitions, and one pass (under a minute on the tiny preset)."
    ),
    passes: int | None = typer.Option(
        None,
        "--passes",
        help="Passes over all cases; each figure is its median over them (more on a noisy machine). "
        "Default 3, or 1 with --quick.",
    ),
    max_bytes: int = typer.Option(16 << 20, "--max-bytes", help="Largest collective message, bytes."),
    out: str = typer.Option("profile.json", "--out", "-o", help="Where to write the profile (JSON or YAML)."),
    workdir: str = typer.Option("orch-profile", "--workdir", help="Scratch folder of the benchmark ranks."),
    json_out: bool = typer.Option(False, "--json", help="Print the profile as JSON on stdout."),
    partition: str | None = typer.Option(None, "--partition", help="Slurm partition (--executor slurm)."),
    account: str | None = typer.Option(None, "--account", help="Slurm account (--executor slurm)."),
    qos: str | None = typer.Option(None, "--qos", help="Slurm QOS (--executor slurm)."),
    time_limit: str = typer.Option("0:30:00", "--time", help="Slurm time limit (--executor slurm)."),
    setup: str | None = typer.Option(None, "--setup", help="Slurm set-up lines (templates/slurm/default-setup.sh)."),
) -> None:
    """Time blocks and collectives on this cluster and write a profile for `orch plan --profile`."""
    from orch.cli.output import console, print_json
    from orch.planner.errors import SpecError
    from orch.planner.io import to_yaml, write_text_atomic
    from orch.planner.loading import load_cluster
    from orch.runtime.models.registry import load_model

    if executor not in EXECUTORS:
        raise SpecError("--executor", "", f"expected one of {', '.join(EXECUTORS)}, got '{executor}'")
    if executor == "slurm" and (nodes is None or nodes < 1):
        raise SpecError("--nodes", "", "--executor slurm needs --nodes N (N >= 1): the nodes to benchmark")
    if executor == "local" and nodes is not None:
        raise SpecError("--nodes", "", "only with --executor slurm; locally, --nproc sets the processes")
    if nproc < 1:
        raise SpecError("--nproc", "", f"expected a positive process count, got {nproc}")
    if passes is None:
        passes = 1 if quick else 3
    if passes < 1:
        raise SpecError("--passes", "", f"expected at least one pass, got {passes}")
    if max_bytes < 1024:
        raise SpecError("--max-bytes", "", f"expected at least 1024 bytes, got {max_bytes}")
    model_spec = load_model(model)
    cluster_spec = load_cluster(cluster)
    from orch.cli.data_cmd import data_spec_for

    data_spec, hint = data_spec_for(
        model_spec, data, "profiling on", global_batch, seq_len, tokenizer, index_dir, media_root, use_audio_in_video
    )
    if hint is not None:
        from rich.markup import escape

        console().print(f"hint: {escape(hint)}")
    if executor == "slurm":
        assert nodes is not None
        nproc = nodes * cluster_spec.gpus_per_node
    rpn = min(cluster_spec.gpus_per_node, nproc)
    if nproc % rpn:
        raise SpecError("--nproc", "", f"{nproc} is not a multiple of the cluster's {rpn} GPUs per node")

    from orch.runtime.profile.cases import ProfileConfig
    from orch.runtime.profile.local import run_profile_local

    cfg = ProfileConfig(
        model_spec.model_dump_json(),
        data_spec.model_dump_json(),
        ranks_per_node=rpn,
        quick=quick,
        passes=passes,
        max_bytes=max_bytes,
        progress=not json_out and executor == "local",
    )
    con = console()
    if executor == "slurm":
        prof = _profile_on_slurm(
            model_spec, cluster_spec, cfg, nodes or 1, workdir, partition, account, qos, time_limit, setup
        )
    else:
        con.print(f"profiling {model_spec.name} on {nproc} local gloo processes ({nproc // rpn} nodes x {rpn})")
        prof = run_profile_local(cfg, nproc=nproc, workdir=workdir)
    prof = prof.model_copy(update={"cluster": cluster_spec.name})
    text = (
        prof.model_dump_json(indent=2) if not out.endswith((".yaml", ".yml")) else to_yaml(prof.model_dump(mode="json"))
    )
    write_text_atomic(out, text)
    if json_out:
        print_json(prof)
        return
    render_profile(prof)
    con.print(f"profile written to [bold]{out}[/]")


def _profile_on_slurm(
    model: ModelSpec,
    cluster: ClusterSpec,
    cfg: ProfileConfig,
    nodes: int,
    workdir: str,
    partition: str | None,
    account: str | None,
    qos: str | None,
    time_limit: str,
    setup: str | None,
) -> Profile:
    """Submit the benchmark as one allocation (runtime/profile/slurm.py), follow it, build the profile."""
    from orch.cli.jobs_cmd import _job_failed, _watch
    from orch.cli.output import console
    from orch.runtime.launch.sbatch import SlurmOptions
    from orch.runtime.profile.slurm import submit_profile

    opts = SlurmOptions(partition=partition, account=account, qos=qos, time=time_limit, setup=setup)
    handle = submit_profile(model, cluster, cfg, nodes, opts, workdir=workdir)
    record = handle.record
    con = console()
    con.print(
        f"profiling {model.name} on {nodes} node(s) x {cluster.gpus_per_node} task(s): job [bold]{record.job_id}[/], "
        f"logs in {record.log_folder}",
        soft_wrap=True,
    )
    final = _watch(record.job_id)
    if final.state != "COMPLETED":
        raise _job_failed(final)
    profile: Profile = handle.result()
    return profile


def render_profile(prof: Profile) -> None:
    from orch.cli.output import console, table

    t = table(
        f"compute fits: t = call + k(c0 + c1·len + c2·len²)  [{prof.device}, {prof.backend}]",
        [
            ("module", "name"),
            ("part", "name"),
            ("tp", "num"),
            ("call", "num"),
            ("c0", "num"),
            ("c1", "num"),
            ("c2", "num"),
            ("err", "num"),
            ("B/tok", "num"),
        ],
        caption="c0, c1, c2: the file's constant, linear, quadratic; call, c0: µs; c1: µs per token; "
        "c2: ns per token²; err: the fit's relative error; "
        "B/tok: activation bytes per token",
    )
    for name, mp in prof.modules.items():
        parts = [("block", tp, f) for tp, f in sorted(mp.block.items())]
        if mp.rest is not None:
            parts.append(("rest", 1, mp.rest))
        for part, tp, f in parts:
            t.add_row(
                name,
                part,
                str(tp),
                f"{f.call * 1e6:.0f}",
                f"{f.constant * 1e6:.0f}",
                f"{f.linear * 1e6:.2f}",
                f"{f.quadratic * 1e9:.2f}",
                f"{f.rel_error:.0%}",
                f"{f.memory_bytes_per_token:.0f}",
            )
        t.add_row(name, "step overhead", "", f"{mp.step_overhead_s * 1e6:.0f}", "", "", "", "", "")
    console().print(t)
    c = table(
        "collectives (nccl-tests: busbw = algbw x bus factor; time in µs, bandwidths in GB/s)",
        [
            ("op", "name"),
            ("link", "name"),
            ("ranks", "num"),
            ("bytes", "num"),
            ("time", "num"),
            ("algbw", "num"),
            ("busbw", "num"),
        ],
    )
    for r in prof.collectives:
        c.add_row(
            r.op,
            r.link,
            str(r.ranks),
            str(r.bytes),
            f"{r.time_s * 1e6:.0f}",
            f"{r.algbw_gbps:.3f}",
            f"{r.busbw_gbps:.3f}",
        )
    console().print(c)
    for kind, lf in prof.links.items():
        console().print(f"{kind}: alpha {lf.alpha_s * 1e6:.0f} µs, {lf.gbps:.2f} GB/s (send/recv fit)")
    if prof.boundary is not None:
        b = prof.boundary
        console().print(f"boundary move (fwd+bwd, per encoder): alpha {b.alpha_s * 1e6:.0f} µs, {b.gbps:.2f} GB/s")
    console().print(
        f"per step: orchestrator {prof.balance_step_s * 1e3:.1f} ms, bookkeeping {prof.step_bookkeeping_s * 1e3:.1f} ms"
    )
    if prof.steal_share is not None:
        again = f"; {prof.passes_repeated} pass(es) timed again for more" if prof.passes_repeated else ""
        console().print(f"CPU time stolen by the host: at most {prof.steal_share:.1%} of a pass{again}")


def validate(
    plan_file: str = typer.Option(..., "--plan", help="Plan file written by `orch plan`."),
    metrics: list[str] = typer.Option(
        ..., "--metrics", help="metrics.jsonl written by `orch launch`; repeat for several runs of the plan."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON on stdout."),
) -> None:
    """Predicted vs measured step time and per-phase times of a run of PLAN."""
    from orch.cli.output import print_json
    from orch.planner.loading import load_json_file
    from orch.planner.plan import Plan
    from orch.runtime.profile.validate import validate as compare
    from orch.runtime.workdir.metrics import read_metrics

    plan = load_json_file(Plan, plan_file)
    result = compare(plan, *(read_metrics(m) for m in metrics))
    if json_out:
        print_json(result)
        return
    render_validation(result)


def render_validation(v: Validation) -> None:
    from orch.cli.output import console, table

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.1f}"

    runs = f" of {v.runs} runs" if v.runs > 1 else ""
    t = table(
        f"{v.placement} plan: predicted vs measured, ms ({v.steps_used} steps{runs})",
        [("phase", "name"), ("predicted", "num"), ("measured", "num"), ("error", "num")],
    )
    for r in v.phases:
        t.add_row(
            r.phase, s(r.predicted_s), s(r.measured_s), "-" if r.relative_error is None else f"{r.relative_error:+.0%}"
        )
    console().print(t)
    if not v.memory:
        return

    def gb(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    m = table(
        "memory per GPU, GB (last step)",
        [("modules", "name"), ("ranks", "num"), ("predicted", "num"), ("peak", "num"), ("state", "num"),
         ("error", "num")],
    )  # fmt: skip
    for r in v.memory:
        err = "-" if r.relative_error is None else f"{r.relative_error:+.0%}"
        m.add_row(r.modules, str(r.ranks), gb(r.predicted_gb), gb(r.measured_peak_gb), gb(r.measured_state_gb), err)
    console().print(m)


def register(app: typer.Typer) -> None:
    app.command()(profile)
    app.command()(validate)
