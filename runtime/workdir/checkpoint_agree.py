"""The checkpoint a run resumes from, its checksums verified by the ranks together once they have met.

Before the rendezvous the launch checks only what is cheap (runtime/workdir/run_dir.py `open_run`: the manifest, every
file and its size), since the other ranks wait for it no longer than the collective timeout. Then every rank
hashes its share of the chosen checkpoint's files (runtime/workdir/checkpoint_manifest.py `share_of`: about equal bytes
each) and the ranks gather what they found; a checkpoint with any file that does not match is skipped, said in
one line as before, and the next older one is tried the same way. A checkpoint saved without a manifest (an older
orch's) cannot be verified: it is taken only when none verifies. Every rank reaches the same answer from the
same gathered list. None at all: RunMismatch on every rank, never a silent start at step 0.
"""

from __future__ import annotations

from pathlib import Path

from orch.runtime.workdir.checkpoint_manifest import NO_MANIFEST, checksum_problem, share_of, verify
from orch.runtime.workdir.checkpoint_metadata import METADATA, metadata_problem
from orch.runtime.workdir.metrics import metrics_path, truncate_after
from orch.runtime.workdir.run_dir import (
    RunMismatch,
    checkpoint_root,
    passed_over_line,
    say,
    step_folders,
    step_name,
    unverified_line,
)
from orch.runtime.workdir.run_identity import fingerprint


def agree_checkpoint(workdir: str | Path, start: int, identity: dict[str, object], rank: int, world: int) -> int:
    """Collective: the completed steps of the newest checkpoint at or below `start` (what the launch chose from
    sizes) whose every file the ranks found intact; none: the newest saved without a manifest (an older orch's,
    unverifiable), said in one line. Rank 0 says which and trims the metrics back to it when it is an older one."""
    import torch.distributed as dist

    folders = step_folders(workdir)
    unverified: tuple[int, Path] | None = None
    for step, folder in folders:
        newer = step > start  # the launch passed it over and said why; it may still be the unverified fallback
        mine = _problem(folder, identity, rank, world, checksums=not newer)
        everyone: list[tuple[str | None, bool]] = [(None, False)] * world
        dist.all_gather_object(everyone, mine)  # every rank decides from the same list
        found = sorted(p for p, _ in everyone if p is not None)
        if found:
            if rank == 0 and not newer:
                say(f"skipping {folder.name}: {found[0]}")
        elif not all(manifested for _, manifested in everyone):
            unverified = unverified or (step, folder)
        elif not newer:
            if rank == 0:
                if unverified is not None and unverified[0] <= start:  # a newer one: the launch said it
                    say(passed_over_line(unverified[1].name, folder.name))
                say(f"resuming from {step_name(step)} (verified)")
                if step != start:
                    truncate_after(metrics_path(workdir), step)
            return step
    if unverified is not None:
        step, folder = unverified
        if rank == 0 and step != start:  # the launch said it already when it chose it
            say(unverified_line(folder.name))
            truncate_after(metrics_path(workdir), step)
        return step
    raise RunMismatch(
        f"{checkpoint_root(workdir)}: none of its {len(folders)} checkpoint(s) verifies (reasons above): launch "
        "with --no-resume to start over (they are moved aside) or restore one"
    )


def _problem(
    folder: Path, identity: dict[str, object], rank: int, world: int, checksums: bool
) -> tuple[str | None, bool]:
    """What this rank found wrong with `folder` (None: its share matches, or it was saved before manifests and its
    `.metadata` is safe to load), and whether the folder has a manifest."""
    manifest = verify(folder, checksums=False)
    if manifest == NO_MANIFEST:
        return metadata_problem(folder / METADATA), False
    if isinstance(manifest, str):
        return manifest, True
    if manifest.model != fingerprint(identity):
        return "a checkpoint of another model", True
    if not checksums:
        return None, True
    return checksum_problem(folder, manifest, share_of(manifest, rank, world)), True
