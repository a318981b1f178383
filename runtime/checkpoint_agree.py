"""The checkpoint a run resumes from, its checksums verified by the ranks together once they have met.

Before the rendezvous the launch checks only what is cheap (runtime/run_dir.py `open_run`: the manifest, every
file and its size), since the other ranks wait for it no longer than the collective timeout. Then every rank
hashes its share of the chosen checkpoint's files (runtime/checkpoint_manifest.py `share_of`: about equal bytes
each) and the ranks gather what they found; a checkpoint with any file that does not match is skipped, said in
one line as before, and the next older one is tried the same way. Every rank reaches the same answer from the
same gathered list. None verifies: RunMismatch on every rank, never a silent start at step 0.
"""

from __future__ import annotations

from pathlib import Path

from orch.runtime.checkpoint_manifest import checksum_problem, share_of, verify
from orch.runtime.metrics import metrics_path, truncate_after
from orch.runtime.run_dir import RunMismatch, checkpoint_root, say, step_folders, step_name
from orch.runtime.run_identity import fingerprint


def agree_checkpoint(workdir: str | Path, start: int, identity: dict[str, object], rank: int, world: int) -> int:
    """Collective: the completed steps of the newest checkpoint at or below `start` (what the launch chose from
    sizes) whose every file the ranks found intact. Rank 0 says which and trims the metrics back to it when it
    is an older one."""
    import torch.distributed as dist

    folders = [(step, folder) for step, folder in step_folders(workdir) if step <= start]
    for step, folder in folders:
        problem, manifested = _problem(folder, identity, rank, world)
        everyone: list[str | None] = [None] * world
        dist.all_gather_object(everyone, problem)
        found = sorted(p for p in everyone if p is not None)
        if not found:
            if rank == 0:
                if manifested:
                    say(f"resuming from {step_name(step)} (verified)")
                if step != start:
                    truncate_after(metrics_path(workdir), step)
            return step
        if rank == 0:
            say(f"skipping {folder.name}: {found[0]}")
    raise RunMismatch(
        f"{checkpoint_root(workdir)}: none of its {len(folders)} checkpoint(s) verifies (reasons above): launch "
        "with --no-resume to start over (they are moved aside) or restore one"
    )


def _problem(folder: Path, identity: dict[str, object], rank: int, world: int) -> tuple[str | None, bool]:
    """What this rank found wrong with `folder` (None: its share matches; a folder saved before manifests is
    loaded unverified, as the launch said), and whether the folder has a manifest."""
    manifest = verify(folder, checksums=False)
    if manifest == "no manifest.json":
        return None, False
    if isinstance(manifest, str):
        return manifest, False
    if manifest.model != fingerprint(identity):
        return "a checkpoint of another model", True
    return checksum_problem(folder, manifest, share_of(manifest, rank, world)), True
