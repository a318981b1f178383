"""Per-sample token lengths drawn from a DataSpec, deterministic per seed.

The planner takes length moments from here, `orch analyze` and the runtime's synthetic
data source take whole batches; all three see the same distribution.
"""

from __future__ import annotations

import json
import math
import random
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from orch.planner.errors import SpecError
from orch.planner.specs import DataSpec, TaskSpec

Lengths = dict[str, int]


class TokenStats(BaseModel):
    """Moments of one module's tokens per sample (0 where the modality is absent)."""

    model_config = ConfigDict(frozen=True)

    mean: float
    mean_sq: float
    max: int
    present: float  # fraction of samples with tokens for this module


@lru_cache(maxsize=16)
def read_manifest(path: str) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Rows of a JSONL manifest: one object of module -> token count per line."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(path, "", "manifest file not found")
    rows = []
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(path, f"line {lineno}", f"not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise SpecError(path, f"line {lineno}", "expected an object of module -> token count")
        lengths = obj.get("lengths", obj)
        row = []
        for key, value in lengths.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SpecError(path, f"line {lineno}: {key}", f"expected a token count >= 0, got {value!r}")
            row.append((str(key), value))
        rows.append(tuple(sorted(row)))
    if not rows:
        raise SpecError(path, "", "manifest has no samples")
    return tuple(rows)


@lru_cache(maxsize=16)
def manifest_row_weights(path: str) -> tuple[float, ...] | None:
    """Each manifest row's chance of a draw where a mix draws its sources by weight (the summary beside a
    conversation index: per source its rows, in order, and its share); None where every row is as likely."""
    summary = Path(path).with_suffix(".json")
    if not summary.is_file():
        return None
    try:
        sources = json.loads(summary.read_text()).get("sources")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(sources, list) or any(not isinstance(s, dict) or "share" not in s for s in sources):
        return None
    total = sum(int(s.get("samples", 0)) for s in sources)
    weights: list[float] = []
    for s in sources:
        n = int(s.get("samples", 0))
        weights += [float(s["share"]) / n] * n if n else []
    if len(weights) != total or all(math.isclose(w * total, 1.0) for w in weights):
        return None
    return tuple(weights)


def _draw_task_lengths(task: TaskSpec, rng: random.Random) -> Lengths:
    out: Lengths = {}
    sigma = task.sigma
    # sorted: the same spec must draw the same lengths whatever order its YAML keys are in
    for module in sorted(task.tokens):
        mean = task.tokens[module]
        if mean == 0:
            out[module] = 0
            continue
        if sigma > 0:
            # log-normal with the task's mean: long tails, as real video/ASR lengths have
            n = round(mean * math.exp(rng.gauss(-sigma * sigma / 2, sigma)))
        else:
            n = mean
        cap = task.max.get(module)
        out[module] = max(1, min(n, cap) if cap is not None else n)
    return out


def read_manifest_items(path: str) -> tuple[dict[str, tuple[int, ...]], ...]:
    """Per row of a manifest (`read_manifest`'s rows, in order), per encoder whose images and videos the index
    lists (`items`: [t, h, w, seconds] each, a native-resolution tower's), its items' tokens as the runtime
    balances them (planner/balance/items.py `grid_item_tokens`: an image one item, a video its temporal runs);
    an empty dict where a row lists none. Rows whose items do not sum to their length list none."""
    from orch.planner.balance.items import grid_item_tokens

    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        got: dict[str, tuple[int, ...]] = {}
        listed = obj.get("items") if isinstance(obj, dict) else None
        lengths = obj.get("lengths", obj) if isinstance(obj, dict) else {}
        for name, grids in (listed or {}).items():
            try:
                tokens = tuple(grid_item_tokens([(int(g[0]), int(g[1]), int(g[2])) for g in grids]))
            except (TypeError, ValueError, IndexError):
                continue
            if sum(tokens) == lengths.get(name):
                got[name] = tokens
        out.append(got)
    return tuple(out)


def sample_lengths(data: DataSpec, n: int, seed: int) -> list[Lengths]:
    """n samples' lengths per module; the LLM cap (seq_len) is applied by the caller's model."""
    rng = random.Random(seed)
    if data.manifest is not None:
        rows = read_manifest(data.manifest)
        shares = manifest_row_weights(data.manifest)
        if shares is not None and len(shares) == len(rows):  # a mix's sources by their shares
            return [dict(r) for r in rng.choices(rows, weights=shares, k=n)]
        return [dict(rows[rng.randrange(len(rows))]) for _ in range(n)]
    weights = [t.weight for t in data.tasks]
    tasks = rng.choices(data.tasks, weights=weights, k=n)
    return [_draw_task_lengths(t, rng) for t in tasks]


def module_lengths(data: DataSpec, module: str, llm: str, samples: int, seed: int) -> list[int]:
    """`module`'s tokens in each of `samples` drawn samples (0 where absent); the LLM's capped at seq_len."""
    out = []
    for lengths in sample_lengths(data, samples, seed):
        v = lengths.get(module, 0)
        out.append(min(v, data.seq_len) if module == llm else v)
    return out


def token_stats(data: DataSpec, module: str, llm: str, samples: int = 8192, seed: int = 0) -> TokenStats:
    """Moments of `module`'s tokens per sample; the LLM's are capped at seq_len."""
    return _token_stats(data.model_dump_json(), module, llm, samples, seed)


@lru_cache(maxsize=64)
def _token_stats(data_json: str, module: str, llm: str, samples: int, seed: int) -> TokenStats:
    data = DataSpec.model_validate_json(data_json)
    drawn = _drawn(data_json, samples, seed)
    values = [min(d.get(module, 0), data.seq_len) if module == llm else d.get(module, 0) for d in drawn]
    return TokenStats(
        mean=sum(values) / len(values),
        mean_sq=sum(v * v for v in values) / len(values),
        max=max(values),
        present=sum(1 for v in values if v > 0) / len(values),
    )


def module_draws(data: DataSpec, module: str, llm: str, samples: int = 8192, seed: int = 0) -> tuple[int, ...]:
    """`module`'s tokens in each sample `token_stats` draws (the LLM's capped at seq_len), in draw order."""
    return _module_draws(data.model_dump_json(), module, llm, samples, seed)


@lru_cache(maxsize=64)
def _module_draws(data_json: str, module: str, llm: str, samples: int, seed: int) -> tuple[int, ...]:
    data = DataSpec.model_validate_json(data_json)
    drawn = _drawn(data_json, samples, seed)
    return tuple(min(d.get(module, 0), data.seq_len) if module == llm else d.get(module, 0) for d in drawn)


def most_held(draws: tuple[int, ...], n: int) -> int:
    """The most tokens n samples hold together, over the draws taken n at a time as a rank takes its samples: what
    a GPU holding n samples' activations at once meets in a run of that many groups (n = 1: the longest sample).
    Below n x the longest where long samples are rare (few groups hold several), above n x the mean where lengths
    spread."""
    n = max(1, min(n, len(draws)))
    return max(sum(draws[i : i + n]) for i in range(0, len(draws) - n + 1, n))


@lru_cache(maxsize=4)
def _drawn(data_json: str, samples: int, seed: int) -> tuple[Lengths, ...]:
    """`sample_lengths` of a data spec (its JSON), drawn once for the moments of all its modules (`_token_stats`).
    Read only: the dicts are shared by every caller."""
    return tuple(sample_lengths(DataSpec.model_validate_json(data_json), samples, seed))
