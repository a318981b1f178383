"""`orch balance` and `orch analyze`: the post-balancing dispatcher on one batch, and on a dataset."""

from __future__ import annotations

import typer

from orch.cli.data_cmd import AUDIO_IN_VIDEO_HELP, INDEX_DIR_HELP, MEDIA_ROOT_HELP
from orch.cli.output import console, print_json, table

MODES = ("orch", "paper", "lpt", "none")


def _mode(value: str) -> str:
    from orch.planner.errors import SpecError

    if value not in MODES:
        raise SpecError("--mode", "", f"expected one of {', '.join(MODES)}, got '{value}'")
    return value


def _bytes(n: float) -> str:
    for unit in ("B", "K", "M", "G"):
        if abs(n) < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}G"


def _num(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def balance(
    batch_file: str = typer.Argument(..., metavar="BATCH.json", help="one global batch (orch schema batch)"),
    json_out: bool = typer.Option(False, "--json", help="Print the destinations and routes as JSON."),
    mode: str = typer.Option("orch", "--mode", help="orch | paper | lpt | none"),
    encoder_balance: str = typer.Option(
        "item", "--encoder-balance", help="item | sample: an encoder phase whose samples list items, by item or whole"
    ),
) -> None:
    """Post-balance one global batch: the destination rank of every sample (or of its items) for every phase."""
    from orch.planner.balance.batch import Batch
    from orch.planner.balance.dispatch import balance_batch
    from orch.planner.balance.mode import Mode
    from orch.planner.errors import SpecError
    from orch.planner.loading import load_json_file

    chosen = Mode(_mode(mode))
    if encoder_balance not in ("item", "sample"):
        raise SpecError("--encoder-balance", "", f"expected item or sample, got '{encoder_balance}'")
    by_item = encoder_balance == "item"
    batch = load_json_file(Batch, batch_file)
    result = balance_batch(batch, chosen, source=batch_file, by_item=by_item)
    if json_out:
        print_json(result)
        return
    baseline = result if chosen == Mode.NONE else balance_batch(batch, Mode.NONE, source=batch_file, by_item=by_item)
    t = table(
        f"orch balance {batch_file}: {len(batch.samples)} samples on {batch.num_ranks} ranks "
        f"({batch.dp_per_node} per node), mode {chosen.value} beside none, encoders by {encoder_balance}",
        [
            ("phase", "name"),
            ("mode", "name"),
            *((c, "num") for c in ("max", "mean", "LB", "max/mean", "max/LB")),
            ("intra", "num"),
            ("inter", "num"),
            ("ms", "num"),
        ],
    )
    for name in batch.phases:
        rows = [("none", baseline.phases[name])]
        if chosen != Mode.NONE:
            rows.append((chosen.value, result.phases[name]))
        for label, r in rows:
            t.add_row(
                name,
                label,
                _num(r.max_cost),
                _num(r.mean_cost),
                _num(r.lower_bound),
                f"{r.max_cost / r.mean_cost:.3f}" if r.mean_cost else "-",
                f"{r.max_cost / r.lower_bound:.3f}" if r.lower_bound else "-",
                _bytes(r.intra_node_bytes),
                _bytes(r.inter_node_bytes),
                f"{r.seconds * 1000:.1f}",
            )
    console().print(t)
    console().print(
        "cost: per rank, the phase's cost model; LB: no placement does better (of items where samples list "
        "them, by item); intra/inter: bytes moved inside / across nodes"
    )


def _bar(counts: list[int], width: int = 30) -> list[str]:
    top = max(counts, default=0) or 1
    return ["#" * round(width * c / top) for c in counts]


def analyze(
    manifest: str = typer.Argument(
        ..., metavar="DATA", help="per-sample lengths (a manifest), or conversations (.jsonl/.json/.parquet, a mix)"
    ),
    dp: int = typer.Option(..., "--dp", help="data-parallel ranks"),
    dp_per_node: int = typer.Option(8, "--ranks-per-node", help="DP ranks per node"),
    micro_batch: int = typer.Option(..., "--micro-batch", help="samples each rank draws per step"),
    steps: int = typer.Option(8, "--steps", help="random global batches to draw"),
    seed: int = typer.Option(0, "--seed", help="random seed (same seed, same numbers)"),
    json_out: bool = typer.Option(False, "--json", help="Print the numbers as JSON."),
    model: str | None = typer.Option(None, "--model", "-m", help="With a conversation data file: the model."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="With a data file: tokenizer.json."),
    index_dir: str | None = typer.Option(None, "--index-dir", help=INDEX_DIR_HELP),
    media_root: str | None = typer.Option(None, "--media-root", help=MEDIA_ROOT_HELP),
    use_audio_in_video: bool = typer.Option(False, "--use-audio-in-video", help=AUDIO_IN_VIDEO_HELP),
) -> None:
    """How much time imbalance wastes per phase on a dataset, and what each balancing mode gains."""
    from orch.planner.balance.analyze import analyze as run
    from orch.planner.data import read_manifest, read_manifest_items
    from orch.planner.errors import SpecError
    from orch.runtime.data.conversations import is_conversation_data

    if is_conversation_data(manifest):  # a user's data file: its token index (runtime/data/index.py)
        from orch.runtime.data.index import build_index
        from orch.runtime.models.registry import load_model

        if model is None:
            raise SpecError(manifest, "", "a conversation data file is counted for a model: pass --model")
        spec = load_model(model)
        path = build_index(manifest, spec, tokenizer, index_dir=index_dir, media_root=media_root,
                           use_audio_in_video=use_audio_in_video).manifest  # fmt: skip
    else:
        path = manifest
    rows = read_manifest(path)
    result = run(rows, dp, dp_per_node, micro_batch, steps=steps, seed=seed, source=manifest,
                 items=read_manifest_items(path))  # fmt: skip
    if json_out:
        print_json(result)
        return
    out = console()
    t = table(
        f"orch analyze {manifest}: {steps} batches of {dp} x {micro_batch} samples, {dp_per_node} ranks/node",
        [
            ("phase", "name"),
            ("mode", "name"),
            ("max cost", "num"),
            ("mean cost", "num"),
            ("wasted", "num"),
            ("x-node", "num"),
            ("ms/step", "num"),
        ],
        caption="wasted: rank time idle waiting for the slowest; x-node: share of bytes moved across nodes",
    )
    for name, per_mode in result.phases.items():
        for mode, s in per_mode.items():
            t.add_row(
                name,
                mode,
                f"{s.max_cost:,.0f}",
                f"{s.mean_cost:,.0f}",
                f"{100 * s.wasted:.1f}%",
                f"{100 * s.inter_node_fraction:.1f}%",
                f"{1000 * s.seconds:.1f}",
            )
    out.print(t)
    out.print(
        "expected speed-up of the balanced phases: "
        + ", ".join(f"{m} {v:.2f}x" for m, v in result.speedup.items() if m != "none")
    )
    for name, h in result.histograms.items():
        out.print(f"\nper-rank {name} cost, first batch (ranks per bin):")
        bars = {m: _bar(c) for m, c in h.counts.items()}
        for k in range(len(h.edges) - 1):
            label = f"{h.edges[k]:>10,.0f}-{h.edges[k + 1]:<10,.0f}"
            cells = "  ".join(f"{m:>4} {h.counts[m][k]:>5} {bars[m][k]:<30}" for m in h.counts)
            out.print(f"  {label} {cells}")


def register(app: typer.Typer) -> None:
    app.command()(balance)
    app.command()(analyze)
