"""A run directory at launch: whose it is, whether the new launch continues it, and from which checkpoint.

`open_run` is what the launcher does once before any rank starts and before anything is written
(runtime/train/trainer.py `TrainTask.prepare`), in this order:

1. room for a checkpoint (runtime/workdir/disk.py: the same one line as a save that ran out of space);
2. the lock (runtime/workdir/run_lock.py): one owner, a stale holder taken over with a note;
3. with `--no-resume`: the previous run's checkpoints, metrics and plan moved aside, to
   WORKDIR/previous-<UTC time>/, before the new run writes anything;
4. with resume: the workdir's plan.json of another model refused (`--no-resume` to start over), a layout
   change noted (DCP re-shards); then the newest checkpoint whose manifest, files and sizes check out
   (`choose_checkpoint`; its checksums the ranks verify together once they meet, falling back to an older one:
   runtime/workdir/checkpoint_agree.py), each one skipped said in one line, a checkpoint of another model refused; one
   saved without a manifest (an older orch's) only when none verifies, said in one line; a `.metadata` naming
   anything but DCP's metadata never (runtime/workdir/checkpoint_metadata.py);
   checkpoints that exist and none verifies: refused, never a silent start at step 0. No checkpoint at all:
   step 0, earlier metrics moved aside rather than deleted.

Torch-free: the launcher's host decides, the ranks are told the step (runtime/train/trainer.py).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orch.planner.errors import OrchError
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.workdir.checkpoint_manifest import NO_MANIFEST, Manifest, read_manifest, verify
from orch.runtime.workdir.checkpoint_metadata import METADATA, metadata_problem
from orch.runtime.workdir.files import make_workdir, others_can_write
from orch.runtime.workdir.metrics import METRICS_FILE
from orch.runtime.workdir.run_identity import data_identity, differences, fingerprint, layouts, model_identity
from orch.runtime.workdir.run_lock import RunLock

CHECKPOINTS = "checkpoints"
LATEST = "latest"
PLAN_FILE = "plan.json"  # the plan a run directory was trained under
TRAIN_FILE = "train.json"  # the training config it ran with (also in every checkpoint)
DATA_FILE = "data.json"  # in every checkpoint: where the data loader stood
MOVED_ASIDE = (CHECKPOINTS, METRICS_FILE, PLAN_FILE, TRAIN_FILE)  # a run's own files, as --no-resume moves them
_STEP = re.compile(r"step_(\d{8})")


class RunMismatch(OrchError):
    """The workdir holds a run of another model, or no checkpoint of it that can be trusted."""


def say(line: str) -> None:
    print(f"orch: {line}", file=sys.stderr, flush=True)


def say_changed(checkpoint: str, what: str, change: str) -> None:
    """A resumed run's one line for a setting it changed since the checkpoint it continues from (the training
    config's: runtime/train/trainer.py `say_changed_settings`; the data spec's: `open_run`)."""
    say(f"{what} changed since {checkpoint}: {change}")


def checkpoint_root(workdir: str | Path) -> Path:
    return Path(workdir) / CHECKPOINTS


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def step_folders(workdir: str | Path) -> list[tuple[int, Path]]:
    """(completed steps, folder) of every published checkpoint folder, newest first (never a .tmp)."""
    root = checkpoint_root(workdir)
    found = []
    for p in root.iterdir() if root.is_dir() else ():
        m = _STEP.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def unverified_line(name: str) -> str:
    return f"{name}: saved without a manifest (an older orch) and no checkpoint verifies: loaded unverified"


def passed_over_line(unverified: str, verified: str) -> str:
    return f"passing over {unverified}: saved without a manifest, it cannot be verified; {verified} can"


def _step_of(folder: Path) -> int:
    return int(folder.name.removeprefix("step_"))


TRASH = ".deleting-"  # a pruned folder's name while it is deleted: never a step folder, never loaded


def prune_checkpoints(workdir: str | Path, keep: int) -> list[str]:
    """Delete all but the newest `keep` step folders (0: none); returns the names deleted. Each is renamed out of
    the step folders' names first, so a crash mid-delete leaves no half checkpoint for a resume to try; an earlier
    crash's leftovers go too."""
    root = checkpoint_root(workdir)
    gone = []
    if keep > 0:
        for _, folder in step_folders(workdir)[keep:]:
            trash = root / f"{TRASH}{folder.name}"
            os.rename(folder, trash)
            gone.append(folder.name)
    for leftover in root.glob(f"{TRASH}*") if root.is_dir() else ():
        shutil.rmtree(leftover, ignore_errors=True)
    return gone


def checkpoint_bytes(plan: Plan, dtype_bytes: int, optimizer_states: int) -> int:
    """About what one checkpoint of the plan's model takes: parameters, and `optimizer_states` tensors like
    each trainable one (AdamW: 2)."""
    from orch.planner.costs import module_params, projector_params

    llm = plan.model.modules[plan.model.llm_name]
    total = 0.0
    for spec in plan.model.modules.values():
        params = module_params(spec) + projector_params(spec, llm)
        total += params * dtype_bytes * (1 + (optimizer_states if spec.trainable else 0))
    return int(total)


def saved_bytes(workdir: str | Path) -> int | None:
    """What the newest checkpoint takes, as its manifest lists it (None: no readable manifest)."""
    for _, folder in step_folders(workdir):
        manifest = read_manifest(folder)
        if not isinstance(manifest, str):
            return sum(f.bytes for f in manifest.files.values())
    return None


@dataclass
class Chosen:
    step: int
    manifest: Manifest | None  # None: a checkpoint saved before manifests (not verified)


def _latest_note(workdir: Path, folders: list[tuple[int, Path]]) -> str | None:
    """What is wrong with checkpoints/latest, when checkpoints exist (None: it names the newest folder)."""
    path = checkpoint_root(workdir) / LATEST
    try:
        text = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return f"{path}: missing; scanning the step folders"
    if not _STEP.fullmatch(text):
        return f"{path}: {text[:40]!a} is not a step folder's name; scanning the step folders"
    if not (path.parent / text).is_dir():
        return f"{path}: names {text}, which is missing; scanning the step folders"
    if text != folders[0][1].name:
        return f"{path}: names {text}, {folders[0][1].name} is newer; scanning the step folders"
    return None


def choose_checkpoint(
    workdir: str | Path,
    identity: dict[str, object] | None,
    tell: Callable[[str], None] = say,
    checksums: bool = True,
) -> Chosen | None:
    """The newest checkpoint that verifies (None: the workdir has none), else the newest saved without a manifest
    (an older orch's: unverifiable, so never preferred to one that verifies). Says why each newer one was skipped;
    RunMismatch if it belongs to another model, or if checkpoints exist and none verifies. checksums=False: the
    manifest and the files' sizes only (a launch: its ranks hash the files together,
    runtime/workdir/checkpoint_agree.py)."""
    folders = step_folders(workdir)
    if not folders:
        return None
    note = _latest_note(Path(workdir), folders)
    if note is not None:
        tell(note)
    unverified: Path | None = None  # the newest folder saved without a manifest: taken only when none verifies
    for step, folder in folders:
        found = verify(folder, checksums)
        if found == NO_MANIFEST:
            found = metadata_problem(folder / METADATA) or found
        if found == NO_MANIFEST:
            unverified = unverified or folder
            continue
        if isinstance(found, str):
            tell(f"skipping {folder.name}: {found}")
            continue
        if identity is not None and found.model != fingerprint(identity):
            what = differences(found.model_identity, identity)
            raise RunMismatch(
                f"{folder}: a checkpoint of another model ({'; '.join(what[:3]) or 'fingerprint differs'}): "
                "launch with --no-resume to start over (the old run is moved aside) or choose another --workdir"
            )
        if unverified is not None:
            tell(passed_over_line(unverified.name, folder.name))
        return Chosen(step, found)
    if unverified is not None:
        tell(unverified_line(unverified.name))
        return Chosen(_step_of(unverified), None)
    raise RunMismatch(
        f"{checkpoint_root(workdir)}: none of its {len(folders)} checkpoint(s) verifies (reasons above): launch "
        "with --no-resume to start over (they are moved aside) or restore one"
    )


def move_aside(workdir: str | Path, now: float | None = None) -> Path | None:
    """The previous run's own files moved into WORKDIR/previous-<UTC time>/ (None: there were none)."""
    root = Path(workdir)
    present = [name for name in MOVED_ASIDE if (root / name).exists()]
    if not present:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = root / f"previous-{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = root / f"previous-{stamp}-{n}"
    target.mkdir()
    for name in present:
        os.rename(root / name, target / name)
    return target


def check_same_model(
    workdir: str | Path,
    plan: Plan,
    identity: dict[str, object],
    factory: str | None,
    tell: Callable[[str], None] = say,
) -> None:
    """RunMismatch if the workdir's plan.json is of another model; a layout change is told and allowed (the
    launch's early check tells nothing: `open_run` says it, once, where the run is prepared)."""
    from pydantic import ValidationError

    path = Path(workdir) / PLAN_FILE
    if not path.is_file():
        return
    try:
        was = Plan.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        tell(f"{path}: unreadable, not compared (the checkpoints' manifests are)")
        return
    what = differences(model_identity(was.model, factory), identity)
    if what:
        raise RunMismatch(
            f"{Path(workdir)}: holds a run of another model ({'; '.join(what[:3])}): launch with --no-resume to "
            "start over (the old run is moved aside) or choose another --workdir"
        )
    before, now = layouts(was), layouts(plan)
    changed = [f"{m} {before.get(m)} -> {now[m]}" for m in now if before.get(m) != now[m]]
    if changed:
        tell(f"the same model on a new layout ({'; '.join(changed)}): checkpoints are re-sharded on load")


@dataclass
class OpenRun:
    lock: RunLock
    start: int  # completed steps the run continues after (0: a new run)


def open_run(
    workdir: str | Path,
    plan: Plan,
    *,
    resume: bool,
    factory: str | None,
    checkpoint_needs: int,
    data: DataSpec | None = None,
) -> OpenRun:
    """Steps 1-4 of the module docstring; the caller releases `lock` when the run ends (or exits)."""
    from orch.runtime.workdir.disk import check_free

    out = make_workdir(workdir)  # 0700 unless asked; one that cannot be written: one line naming it
    if others_can_write(out):
        say(f"{out}: its group or others can write it, and could plant files the run loads: chmod go-w {out}")
    check_free(checkpoint_root(out), checkpoint_needs, "a checkpoint")
    lock = RunLock(out)
    lock.acquire()
    try:
        for note in lock.notes:
            say(note)
        identity = model_identity(plan.model, factory)
        if not resume:
            moved = move_aside(out)
            if moved is not None:
                say(f"--no-resume: the previous run's files moved to {moved}")
            return OpenRun(lock, 0)
        check_same_model(out, plan, identity, factory)
        # Sizes only here: before the rendezvous, which waits for this (its timeout), hashing a large checkpoint on
        # one host would fail the launch; the ranks verify the checksums together once they meet.
        chosen = choose_checkpoint(out, identity, checksums=False)
        if chosen is None:
            if (out / METRICS_FILE).exists():
                moved = move_aside(out)
                say(f"no checkpoint in {checkpoint_root(out)}: starting at step 0; the earlier files moved to {moved}")
            return OpenRun(lock, 0)
        if chosen.manifest is None:
            say(f"resuming from {step_name(chosen.step)}")  # the ranks say it once they verified the checksums
        if (
            data is not None
            and chosen.manifest is not None
            and chosen.manifest.data != fingerprint(data_identity(data))
        ):
            say_changed(step_name(chosen.step), "the data spec", "continuing on this one")
        return OpenRun(lock, chosen.step)
    except BaseException:
        lock.release()
        raise
