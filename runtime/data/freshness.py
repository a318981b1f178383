"""Whether a plan's data index still describes its data files: the check `orch launch` makes before any rank starts.

A plan on a data file records the file (`DataSpec.source`) and its index (`DataSpec.manifest`), whose summary keeps
each source's index key (runtime/data/index.py `file_key`: path, size, mtime). A file edited since it was indexed
would train silently on what the index no longer describes (an edited answer trains as edited; appended rows are
never drawn), so the launch is refused in one line naming the file, what changed, and what to do. A summary
written before it kept keys is checked by time: a data file modified after its index was written. Torch-free.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from orch.planner.errors import SpecError
from orch.planner.specs import DataSpec
from orch.runtime.data.index import file_key

REDO = "re-run `orch plan` (or `orch data index`) on it and launch the new plan"


def _when(mtime_ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mtime_ns / 1e9))


def changed_since_indexed(path: str, recorded: str | None, indexed_ns: int) -> str | None:
    """What changed in data file `path` since its index was made (None: nothing): against its `recorded` index key,
    else (an older summary without keys) its mtime against `indexed_ns`, when the index was written."""
    file = Path(path)
    if not file.is_file():
        return "it is gone"
    now = file_key(path)
    if recorded is None:
        mtime = file.stat().st_mtime_ns
        if mtime <= indexed_ns:
            return None
        return f"modified {_when(mtime)}, after its index was written ({_when(indexed_ns)})"
    if now == recorded:
        return None
    _, was_size, was_mtime = recorded.rsplit(":", 2)
    _, size, mtime = now.rsplit(":", 2)
    if size != was_size:
        return f"size {was_size} -> {size} bytes, modified {_when(int(mtime))}"
    return f"modified {_when(int(mtime))} (indexed as of {_when(int(was_mtime))}), same size"


def check_index_current(data: DataSpec, where: str) -> None:
    """SpecError (one line) when a data file of `data`'s index changed since it was indexed; `where` names the spec
    the data came from (the plan file or --data). Synthetic data and a manifest without its summary: nothing to
    check."""
    if data.source is None or data.manifest is None:
        return
    manifest = Path(data.manifest)
    summary = manifest.with_suffix(".json")
    try:
        sources = json.loads(summary.read_text())["sources"]
        indexed_ns = manifest.stat().st_mtime_ns
    except (OSError, ValueError, KeyError, TypeError):
        return  # no summary to check against: the runtime reads the manifest as it is
    for source in sources:
        path = str(source.get("path", ""))
        if not path:
            continue
        change = changed_since_indexed(path, source.get("key"), indexed_ns)
        if change is not None:
            raise SpecError(path, "", f"changed since it was indexed for {where} ({change}): {REDO}")


def index_mismatch(folder: Path, index: str) -> str | None:
    """Why a run on the data index `index` cannot resume the checkpoint in `folder` (None: it can): the sampler's
    position it saved (data.json) means the same batches only on the index it drew them from."""
    from orch.runtime.workdir.run_dir import DATA_FILE

    saved = folder / DATA_FILE
    if not saved.is_file():
        return None
    try:
        was = json.loads(saved.read_text()).get("index")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: the checkpoint's manifest check refuses a damaged folder
    if was == index:
        return None
    return (
        f"{saved}: the checkpoint drew its batches from {was}; the data now indexes as {index} (the data file, its "
        "tokenizer or the model changed): resume in a fresh workdir, or --no-resume"
    )


def check_resume_data(workdir: str | Path, data: DataSpec, identity: dict[str, object]) -> None:
    """At launch, before any rank starts: OrchError when the checkpoint a resumed run would continue from
    drew its batches from another index than `data`'s (a re-plan after the data changed)."""
    from orch.planner.errors import OrchError
    from orch.runtime.workdir.run_dir import checkpoint_root, choose_checkpoint, step_name

    if data.manifest is None:
        return
    try:
        chosen = choose_checkpoint(workdir, identity, tell=lambda _: None, checksums=False)
    except OrchError:
        return  # the run's own opening says why none can be resumed
    if chosen is None:
        return
    problem = index_mismatch(checkpoint_root(workdir) / step_name(chosen.step), data.manifest)
    if problem is not None:
        raise OrchError(problem)
