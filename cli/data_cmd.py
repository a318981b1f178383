"""`orch data index`: a user's conversation data counted in tokens per module, and the data spec `orch plan`
and `orch analyze` make of it (runtime/data/index.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orch.cli.output import console, print_json_text, table

if TYPE_CHECKING:
    from orch.planner.specs import DataSpec, ModelSpec

DEFAULT_GLOBAL_BATCH = 256
SEQ_LEN_UNIT = 128

data_app = typer.Typer(help="Users' data: conversations with images and audio (JSONL, JSON, parquet, mix files).")


@data_app.command("index")
def index(
    data: str = typer.Argument(
        ...,
        metavar="DATA",
        help="A .jsonl/.json/.parquet data file, a mix file (YAML), a "
        "directory of data files, or DIR/dataset_info.json:NAME[,NAME] (LLaMA-Factory's).",
    ),
    model: str = typer.Option(..., "--model", "-m", help="Model spec file, preset, or Hugging Face model directory."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="tokenizer.json (default: the LLM's HF directory)."),
    max_image_tokens: int = typer.Option(1024, "--max-image-tokens", help="Cap on a reference tower's patches."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Count every sample's tokens per module from the files' headers; cache the index beside the data.
    Exits 1 when a sample is malformed (each listed as file:line: what is wrong)."""
    import json
    import statistics
    import sys

    from orch.planner.data import read_manifest
    from orch.planner.loading import load_model
    from orch.runtime.data.index import build_index

    spec = load_model(model)
    idx = build_index(data, spec, tokenizer, max_image_tokens)
    rows = read_manifest(idx.manifest)
    modules = [*sorted(spec.encoder_names), spec.llm_name]
    stats = {}
    for m in modules:
        values = sorted(dict(r).get(m, 0) for r in rows)
        present = [v for v in values if v > 0]
        stats[m] = {
            "samples_with": len(present),
            "mean": statistics.fmean(present) if present else 0.0,
            "p50": present[len(present) // 2] if present else 0,
            "p99": present[min(len(present) - 1, int(0.99 * len(present)))] if present else 0,
            "max": values[-1],
        }
    if json_out:
        print_json_text(json.dumps({"manifest": idx.manifest, "samples": idx.samples, "sources": idx.sources,
                                    "modules": stats}))  # fmt: skip
    else:
        out = console()
        t = table(
            f"{data}: {idx.samples} samples" + (" (cached index)" if idx.cached else ""),
            [("module", "name"), ("samples", "num"), ("mean", "num"), ("p50", "num"), ("p99", "num"), ("max", "num")],
            caption="tokens per sample where the module has any; llm: text plus every encoder's projected tokens",
        )
        for m, s in stats.items():
            t.add_row(m, str(s["samples_with"]), f"{s['mean']:.0f}", str(s["p50"]), str(s["p99"]), str(s["max"]))
        out.print(t)
        out.print(f"index: {idx.manifest}")
    for line in idx.bad:
        print(f"error: {line}", file=sys.stderr)
    if idx.bad:
        print(f"error: {len(idx.bad)} malformed samples (skipped in training)", file=sys.stderr)
        raise typer.Exit(1)


@data_app.command("inspect")
def inspect(
    data: str = typer.Argument(
        ..., metavar="DATA", help="A .jsonl/.json/.parquet data file (or one dataset: DIR/dataset_info.json:NAME)."
    ),
    model: str = typer.Option(..., "--model", "-m", help="Model spec file or preset."),
    sample: int = typer.Option(1, "--sample", help="Which sample, 1-based (the line of a JSONL file)."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="tokenizer.json (default: the LLM's HF directory)."),
    seq_len: int = typer.Option(8192, "--seq-len", help="Cap on LLM tokens per sample."),
    json_out: bool = typer.Option(False, "--json", help="input_ids, labels (-100: not trained) and input shapes."),
) -> None:
    """How one sample is tokenized and which of its tokens are trained on (shown highlighted)."""
    import json

    from rich.text import Text

    from orch.planner.errors import SpecError
    from orch.planner.loading import load_model
    from orch.runtime.data.conversations import BadSample, read_conversations, read_sources
    from orch.runtime.data.index import IGNORE, TextCounter, TokenRules, find_tokenizer
    from orch.runtime.data.media import media_processors
    from orch.runtime.data.processing import as_json, process

    spec = load_model(model)
    sources = read_sources(data)
    if len(sources) != 1:
        raise SpecError(data, "", "inspect reads one data file, not a mix (name one of its sources)")
    if sample < 1:
        raise SpecError("--sample", "", f"expected a sample number from 1, got {sample}")
    found = next((c for i, c in enumerate(read_conversations(sources[0].path, sources[0]), start=1) if i == sample),
                 None)  # fmt: skip
    if found is None:
        raise SpecError(data, "--sample", f"no sample {sample}")
    if isinstance(found, BadSample):
        raise SpecError(found.where, "", found.what)
    counter = TextCounter(*find_tokenizer(spec, tokenizer))
    try:
        out = process(found, spec, TokenRules.of(spec), counter, seq_len, processors=media_processors(spec))
    except (OSError, ValueError) as exc:
        raise SpecError(found.where, "", f"cannot read its media ({type(exc).__name__}: {exc})") from None
    if json_out:
        print_json_text(json.dumps(as_json(out, spec, counter)))
        return
    from orch.runtime.data.expansion import conversation_layout, placeholder_inserts

    layout = conversation_layout(spec, out.marks, len(out.input_ids), out.media)
    placed: dict[int, list[str]] = {}  # before token j: the expanded placeholders
    count = {"<image>": 0, "<video>": 0, "<audio>": 0}
    for (at, tag), inserts in zip(out.marks, placeholder_inserts(spec, out.marks, out.media)[1], strict=True):
        count[tag] += 1
        placed.setdefault(at, []).append(f"{tag[:-1]} {count[tag]}: {sum(n for _, _, n in inserts)} rows>")
    shown = Text()
    for j, (tid, label) in enumerate([*zip(out.input_ids, out.labels, strict=True), (None, IGNORE)]):
        for tag in placed.get(j, []):
            shown.append(tag + " ", style="bold cyan")
        if tid is None:
            break
        piece = counter.tokenizer.id_to_token(tid) or f"<{tid}>"
        shown.append(piece + " ", style="bold green" if label != IGNORE else "dim")
    c = console()
    c.print(f"{out.where}: {layout.length} LLM tokens: {len(out.input_ids)} text, {out.trained_tokens} trained"
            " (green), images and clips (cyan) where their placeholders stood"
            + (", truncated to --seq-len" if out.truncated else ""))  # fmt: skip
    c.print(shown)
    for name, rows in out.features.items():
        c.print(f"{name}: input {list(rows.shape)}")


def data_spec_for(
    model: ModelSpec,
    data: str | None,
    verb: str,
    global_batch: int | None = None,
    seq_len: int | None = None,
    tokenizer: str | None = None,
) -> tuple[DataSpec, str | None]:
    """What `--data` names, wherever a command takes it: a conversation data file or mix (its index), else a
    data spec file or preset (or the model's default); and the hint line to print."""
    from orch.planner.loading import data_for
    from orch.runtime.data.conversations import is_conversation_data

    if data is not None and is_conversation_data(data):
        return conversation_data(model, data, global_batch, seq_len, tokenizer)
    spec, hint = data_for(model, data, verb)
    # a spec or preset takes the overrides too (the planner's batch error names --global-batch)
    update = {k: v for k, v in (("global_batch", global_batch), ("seq_len", seq_len)) if v is not None}
    if update:
        for key, value in update.items():
            if value <= 0:
                from orch.planner.errors import SpecError

                raise SpecError(f"--{key.replace('_', '-')}", "", f"expected a positive integer, got {value}")
        spec = spec.model_copy(update=update)
    return spec, hint


def conversation_data(
    model: ModelSpec, data: str, global_batch: int | None, seq_len: int | None, tokenizer: str | None
) -> tuple[DataSpec, str]:
    """The DataSpec of a conversation data file (its index as the manifest) and the hint line that says so."""
    from pathlib import Path

    from orch.planner.data import read_manifest
    from orch.planner.specs import DataSpec
    from orch.runtime.data.index import build_index

    idx = build_index(data, model, tokenizer)
    longest = max(dict(r).get(model.llm_name, 0) for r in read_manifest(idx.manifest))
    seq = seq_len or -(-longest // SEQ_LEN_UNIT) * SEQ_LEN_UNIT
    batch = global_batch or DEFAULT_GLOBAL_BATCH
    spec = DataSpec(
        name=data,
        global_batch=batch,
        seq_len=seq,
        manifest=idx.manifest,
        source=str(Path(data).resolve()),
        tokenizer=str(Path(tokenizer).resolve()) if tokenizer else None,
    )
    bad = f", {len(idx.bad)} malformed skipped (orch data index lists them)" if idx.bad else ""
    hint = (
        f"data: {idx.samples} samples of {data}{bad}; global batch {batch}"
        + ("" if global_batch else " (--global-batch)")
        + f", seq_len {seq}"
        + ("" if seq_len else " (--seq-len; the longest sample)")
    )
    return spec, hint


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
