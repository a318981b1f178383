"""`orch data index`: a user's conversation data counted in tokens per module, and the data spec `orch plan`
and `orch analyze` make of it (runtime/data/index.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from orch.cli.output import console, print_json_text, table

if TYPE_CHECKING:
    from orch.planner.specs import DataSpec, ModelSpec
    from orch.runtime.data.index import DataIndex

DEFAULT_GLOBAL_BATCH = 256
DEFAULT_STEPS = 1000  # the run `orch data index` counts a mix's epochs over, unless --steps says
SEQ_LEN_UNIT = 128
LISTED = 20  # malformed or untrained samples listed one a line; the rest counted
SAMPLE_NUMBERS = "numbered by file line from 1 (a JSON list's or parquet file's elements from 1), as skip messages are"
INDEX_DIR_HELP = "Where the index is kept (default: .orch-index/ beside the data if writable, else ~/.cache/orch)."
MODEL_HELP = "Model spec file, preset, or Hugging Face model directory."
MEDIA_ROOT_HELP = "Folder media paths are relative to (default: each data file's folder; LLaMA-Factory's media_dir)."
AUDIO_IN_VIDEO_HELP = (
    "Train each video with its own audio where a record or its mix source does not say (use_audio_in_video): "
    "the <audio> after its <video>, else the video's audio track."
)

data_app = typer.Typer(help="Users' data: conversations with images and audio (JSONL, JSON, parquet, mix files).")


@data_app.command("index")
def index(
    data: str = typer.Argument(
        ...,
        metavar="DATA",
        help="A .jsonl/.json/.parquet data file, a mix file (YAML), a "
        "directory of data files, or DIR/dataset_info.json:NAME[,NAME] (LLaMA-Factory's).",
    ),
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="tokenizer.json (default: the LLM's HF directory)."),
    max_image_tokens: int = typer.Option(1024, "--max-image-tokens", help="Cap on a reference tower's patches."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    index_dir: str | None = typer.Option(None, "--index-dir", help=INDEX_DIR_HELP),
    media_root: str | None = typer.Option(None, "--media-root", help=MEDIA_ROOT_HELP),
    global_batch: int = typer.Option(
        DEFAULT_GLOBAL_BATCH, "--global-batch", help="Samples per step of the run the epochs are counted for."
    ),
    steps: int = typer.Option(DEFAULT_STEPS, "--steps", help="Steps of the run the epochs are counted for."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when a sample is malformed or trains no token."),
    use_audio_in_video: bool = typer.Option(False, "--use-audio-in-video", help=AUDIO_IN_VIDEO_HELP),
) -> None:
    """Count every sample's tokens per module from the files' headers; cache the index (beside the data if
    writable). Each source's rows, share of the draws and epochs in a run of --steps x --global-batch samples.
    Malformed samples and samples that train no token are listed as warnings (file:line: what) and skipped;
    --strict makes them an error (exit 1)."""
    import json
    import statistics

    from orch.planner.data import read_manifest
    from orch.planner.errors import SpecError
    from orch.runtime.data.index import build_index
    from orch.runtime.models.registry import load_model

    for flag, value in (("--global-batch", global_batch), ("--steps", steps)):
        if value <= 0:
            raise SpecError(flag, "", f"expected a positive integer, got {value}")
    spec = load_model(model)
    idx = build_index(data, spec, tokenizer, max_image_tokens, index_dir, media_root, use_audio_in_video)
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
    draws = mix_draws(idx, global_batch, steps)
    if json_out:
        run = {"steps": steps, "global_batch": global_batch}
        print_json_text(json.dumps({"manifest": idx.manifest, "samples": idx.samples, "sources": idx.sources,
                                    "strategy": idx.strategy, "replacement": idx.replacement, "modules": stats,
                                    "run": run, "draws": draws}))  # fmt: skip
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
        out.print(sources_table(idx, draws, global_batch, steps))
        out.print(f"index: {idx.manifest}")
    if report_skips(data, idx, strict) and strict:
        raise typer.Exit(1)


def mix_draws(idx: DataIndex, global_batch: int, steps: int) -> list[dict[str, float]]:
    """Per source: its share of the draws, and the draws and epochs of it in a run of steps x global_batch."""
    mix = idx.mix()
    total = global_batch * steps
    return [{"share": share, "draws": share * total, "epochs": share * total / n if n else 0.0}
            for share, n in zip(mix.shares(), mix.sizes, strict=True)]  # fmt: skip


def sources_table(idx: DataIndex, draws: list[dict[str, float]], global_batch: int, steps: int) -> Any:
    """Each source's rows, weight, share of the draws and epochs over a run (`mix_draws`)."""
    from pathlib import Path

    mix = idx.mix()
    how = idx.strategy + (", with replacement" if idx.replacement else "") if len(idx.sources) > 1 else "one file"
    epoch = mix.epoch_draws()
    steps_per_epoch = (
        f"{epoch / global_batch:.1f} steps"
        if epoch >= global_batch
        else f"less than a step (a step of {global_batch} draws spans {global_batch / max(epoch, 1):.1f} epochs)"
    )
    t = table(
        f"sources ({how}): an epoch is {epoch} draws, {steps_per_epoch}",
        [
            ("source", "name"),
            ("rows", "num"),
            ("weight", "num"),
            ("share", "num"),
            ("epochs", "num"),
            ("skipped", "num"),
        ],
        caption=f"epochs: of each source in {steps} steps x {global_batch} samples (--steps, --global-batch)",
    )
    for s, d in zip(idx.sources, draws, strict=True):
        skipped = len(s["bad"]) + len(s.get("untrained", []))
        t.add_row(Path(s["path"]).name, str(s["samples"]), f"{s['weight']:g}", f"{d['share']:.1%}",
                  f"{d['epochs']:.2f}", str(skipped))  # fmt: skip
    return t


def report_skips(data: str, idx: DataIndex, strict: bool = False) -> int:
    """One line on stderr per skipped sample (malformed, or training no token: at most LISTED of each, then
    a count), and per source whose every row was skipped; `strict` says `error:`. The number skipped."""
    import sys

    level = "error" if strict else "warning"
    for kind, lines in (("malformed", idx.bad), ("untrained", [f"{u}: no assistant turn: trains no token"
                                                              for u in idx.untrained])):  # fmt: skip
        for line in lines[:LISTED]:
            print(f"{level}: {line}", file=sys.stderr)
        if len(lines) > LISTED:
            print(f"{level}: ... and {len(lines) - LISTED} more {kind} samples", file=sys.stderr)
    for k, s in enumerate(idx.sources):
        if not s["samples"]:
            left = " (the others' shares grow to fill its)" if len(idx.sources) > 1 else ""
            print(f"{level}: {data}: sources[{k}]: {s['path']}: every row was skipped{left}", file=sys.stderr)
    skipped = len(idx.bad) + len(idx.untrained)
    if skipped:
        parts = [f"{n} {what}" for n, what in ((len(idx.bad), "malformed"), (len(idx.untrained),
                 "training no token")) if n]  # fmt: skip
        then = "" if strict else " (--strict: exit 1)"
        print(f"{level}: {skipped} samples skipped: {', '.join(parts)}{then}", file=sys.stderr)
    report_silent(idx.silent)
    return skipped


def report_silent(lines: list[str]) -> None:
    """One warning line on stderr per video trained without its sound under use_audio_in_video (it has no audio
    track: its video alone), at most LISTED, then the count."""
    import sys

    for line in lines[:LISTED]:
        print(f"warning: {line}", file=sys.stderr)
    if len(lines) > LISTED:
        print(f"warning: ... and {len(lines) - LISTED} more videos without an audio track", file=sys.stderr)
    if lines:
        print(f"warning: {len(lines)} videos without an audio track trained as their video alone "
              "(use_audio_in_video)", file=sys.stderr)  # fmt: skip


@data_app.command("inspect")
def inspect(
    data: str = typer.Argument(
        ..., metavar="DATA", help="A .jsonl/.json/.parquet data file (or one dataset: DIR/dataset_info.json:NAME)."
    ),
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    sample: int = typer.Option(1, "--sample", help=f"Which sample: {SAMPLE_NUMBERS}."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="tokenizer.json (default: the LLM's HF directory)."),
    seq_len: int = typer.Option(8192, "--seq-len", help="Cap on LLM tokens per sample."),
    json_out: bool = typer.Option(False, "--json", help="input_ids, labels (-100: not trained) and input shapes."),
    media_root: str | None = typer.Option(None, "--media-root", help=MEDIA_ROOT_HELP),
    use_audio_in_video: bool = typer.Option(False, "--use-audio-in-video", help=AUDIO_IN_VIDEO_HELP),
) -> None:
    """How one sample is tokenized and which of its tokens are trained on (shown highlighted). --sample numbers
    the file's lines from 1 (a JSON list's or parquet file's elements), the file:line the index and the skip
    messages name."""
    import dataclasses
    import json
    from pathlib import Path

    from rich.text import Text

    from orch.planner.errors import SpecError
    from orch.runtime.data.conversations import NO_SUCH, BadSample, SampleFile, read_sources
    from orch.runtime.data.index import IGNORE, TextCounter, TokenRules, find_tokenizer, resolve_sounds
    from orch.runtime.data.media import media_processors
    from orch.runtime.data.processing import as_json, process
    from orch.runtime.models.registry import load_model
    from orch.runtime.sample import AUDIO, IMAGE, SOUNDING_VIDEO, VIDEO

    spec = load_model(model)
    sources = read_sources(data)
    if len(sources) != 1:
        raise SpecError(data, "", "inspect reads one data file, not a mix (name one of its sources)")
    if sample < 1:
        raise SpecError("--sample", "", f"expected a sample number from 1, got {sample}")
    if media_root is not None and not Path(media_root).is_dir():
        raise SpecError("--media-root", "", f"{media_root}: not a directory")
    source = sources[0]
    if source.use_audio_in_video is None:
        source = dataclasses.replace(source, use_audio_in_video=use_audio_in_video)
    found = SampleFile(source.path, source, media_root).get(sample)  # that line alone parsed
    if isinstance(found, BadSample) and found.what.startswith(NO_SUCH):
        raise SpecError(data, "--sample", f"no sample at line {sample} ({SAMPLE_NUMBERS})")
    if isinstance(found, BadSample):
        raise SpecError(found.where, "", found.what)
    rules = TokenRules.of(spec)
    heard = resolve_sounds(found, rules)  # a video without an audio track: its video alone, said as the index says
    if isinstance(heard, BadSample):
        raise SpecError(heard.where, "", heard.what)
    found = heard[0]
    report_silent(heard[1])
    counter = TextCounter(*find_tokenizer(spec, tokenizer))
    try:
        out = process(found, spec, rules, counter, seq_len, processors=media_processors(spec))
    except Exception as exc:  # OSError, ValueError, Pillow's DecompressionBombError: one line naming the file
        from orch.runtime.data.index import medium_problem

        media = [("image", f) for f in found.images] + [("video", f) for f in found.videos]
        media += [("audio", f) for _, f in found.clips()]
        named = next((f"{path}: {why}" for kind, path in media if (why := medium_problem(path, kind))), None)
        raise SpecError(found.where, "", f"cannot read its media: {named or f'{type(exc).__name__}: {exc}'}") from None
    if json_out:
        print_json_text(json.dumps({"sample": sample, "numbering": SAMPLE_NUMBERS, **as_json(out, spec, counter)}))
        return
    from orch.runtime.data.expansion import conversation_layout, placeholder_inserts

    layout = conversation_layout(spec, out.marks, len(out.input_ids), out.media, out.items)
    placed: dict[int, list[str]] = {}  # before token j: the expanded placeholders
    count = dict.fromkeys((IMAGE, VIDEO, AUDIO, SOUNDING_VIDEO), 0)
    for (at, tag), inserts in zip(out.marks, placeholder_inserts(spec, out.marks, out.media, out.items)[1],
                                  strict=True):  # fmt: skip
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
    c.print(f"--sample {sample}: {out.where} (samples are {SAMPLE_NUMBERS})")
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
    index_dir: str | None = None,
    media_root: str | None = None,
    use_audio_in_video: bool = False,
) -> tuple[DataSpec, str | None]:
    """What `--data` names, wherever a command takes it: a conversation data file or mix (its index), else a
    data spec file or preset (or the model's default); and the hint line to print."""
    from orch.planner.loading import data_for
    from orch.runtime.data.conversations import is_conversation_data

    if data is not None and is_conversation_data(data):
        return conversation_data(model, data, global_batch, seq_len, tokenizer, index_dir, media_root,
                                 use_audio_in_video)  # fmt: skip
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
    model: ModelSpec,
    data: str,
    global_batch: int | None,
    seq_len: int | None,
    tokenizer: str | None,
    index_dir: str | None = None,
    media_root: str | None = None,
    use_audio_in_video: bool = False,
) -> tuple[DataSpec, str]:
    """The DataSpec of a conversation data file (its index as the manifest) and the hint line that says so; a
    warning line each for samples skipped and a global batch larger than the data."""
    from pathlib import Path

    from orch.planner.data import read_manifest
    from orch.planner.specs import DataSpec
    from orch.runtime.data.index import build_index

    idx = build_index(data, model, tokenizer, index_dir=index_dir, media_root=media_root,
                      use_audio_in_video=use_audio_in_video)  # fmt: skip
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
    skipped = len(idx.bad) + len(idx.untrained)
    bad = f", {skipped} skipped (orch data index lists them)" if skipped else ""
    if idx.silent:
        bad += f", {len(idx.silent)} videos without an audio track trained as their video alone"
    warn_batch_over_data(batch, idx.samples, data)
    hint = (
        f"data: {idx.samples} samples of {data}{bad}; global batch {batch}"
        + ("" if global_batch else " (--global-batch)")
        + f", seq_len {seq}"
        + ("" if seq_len else " (--seq-len; the longest sample)")
    )
    return spec, hint


def warn_batch_over_data(global_batch: int, samples: int, data: str) -> None:
    """One line on stderr where a step holds more samples than the data has (each step repeats samples)."""
    if global_batch > samples:
        typer.echo(f"warning: global batch {global_batch} is larger than the {samples} samples of {data}: every "
                   f"step repeats samples ({global_batch / samples:.1f} epochs a step)", err=True)  # fmt: skip


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
