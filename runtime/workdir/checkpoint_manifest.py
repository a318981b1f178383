"""A checkpoint's manifest.json: what it belongs to and a checksum of every file, and its verification.

Written by rank 0 inside step_XXXXXXXX.tmp before the folder is renamed (runtime/workdir/checkpoint.py), so a
published checkpoint always carries it. `verify` checks what resume and export rely on, cheapest first: the
manifest parses, every file it lists is there with its size, DCP's `.metadata` names nothing but DCP's metadata
(runtime/workdir/checkpoint_metadata.py: the sha256 is no key, anyone who can write the folder can recompute it), then
every file's sha256 (on threads: the checkpoint read once, at the disk's speed more than one core's; a launch
leaves the sha256 to its ranks, each hashing a share: `share_of`). Torch-free.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orch.runtime.workdir.checkpoint_metadata import METADATA, metadata_problem

MANIFEST = "manifest.json"
NO_MANIFEST = f"no {MANIFEST}"  # what `verify` says of a folder saved before manifests
_CHUNK = 1 << 22


class FileSum(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bytes: int = Field(ge=0)
    sha256: str


class Manifest(BaseModel):
    """What a checkpoint belongs to (runtime/workdir/run_identity.py) and what it holds."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    step: int = Field(ge=0, description="completed steps")
    model: str = Field(description="the model's fingerprint: its identity hashed")
    model_identity: dict[str, Any] = Field(description="what the fingerprint hashes (to say what differs)")
    layouts: dict[str, str] = Field(description="module -> the layout it was saved from (informative)")
    data: str = Field(description="the data spec's fingerprint")
    files: dict[str, FileSum] = Field(description="every other file of the folder: size and sha256")


def file_sum(path: Path) -> FileSum:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileSum(bytes=size, sha256=digest.hexdigest())


def read_manifest(folder: Path) -> Manifest | str:
    """The folder's manifest, or why there is none to trust (one phrase)."""
    path = folder / MANIFEST
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return NO_MANIFEST
    except OSError as exc:
        return f"{MANIFEST}: unreadable ({exc.strerror})"
    except ValidationError:
        return f"{MANIFEST}: not a manifest this orch reads (damaged?)"


def _kind(name: str) -> str:
    if name.endswith(".distcp"):
        return f"shard {name}"
    return "metadata .metadata" if name == ".metadata" else f"file {name}"


def verify(folder: Path, checksums: bool = True) -> Manifest | str:
    """The manifest if every file it lists is intact, else the first problem (`shard __1_0.distcp: checksum
    mismatch`). checksums=False: the manifest, every file and its size only (what a launch checks before its
    ranks start; the ranks then hash the files together: runtime/workdir/checkpoint_agree.py)."""
    manifest = read_manifest(folder)
    if isinstance(manifest, str):
        return manifest
    if METADATA not in manifest.files:
        return f"{MANIFEST}: lists no .metadata"
    for name, want in sorted(manifest.files.items()):
        try:
            size = (folder / name).stat().st_size
        except FileNotFoundError:
            return f"{_kind(name)}: missing"
        if size != want.bytes:
            return f"{_kind(name)}: {size} bytes, {want.bytes} written (truncated or replaced)"
    unsafe = metadata_problem(folder / METADATA)  # a hash anyone can recompute is no guard against code in a pickle
    if unsafe is not None:
        return unsafe
    if not checksums:
        return manifest
    problem = checksum_problem(folder, manifest, sorted(manifest.files))
    return manifest if problem is None else problem


def checksum_problem(folder: Path, manifest: Manifest, names: list[str]) -> str | None:
    """The first of `names` whose sha256 differs from the manifest's or that cannot be read (None: all match)."""
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:  # hashlib releases the GIL
        sums = list(pool.map(_sum_or_error, [folder / name for name in names]))
    for name, got in zip(names, sums, strict=True):
        if isinstance(got, str):
            return f"{_kind(name)}: unreadable ({got})"
        if got.sha256 != manifest.files[name].sha256:
            return f"{_kind(name)}: checksum mismatch"
    return None


def share_of(manifest: Manifest, rank: int, world: int) -> list[str]:
    """The files `rank` of `world` hashes when the ranks verify a checkpoint together: the largest first, each
    to the rank with the fewest bytes so far (every rank computes the same split from the manifest)."""
    load = [0] * world
    mine: list[str] = []
    for name, f in sorted(manifest.files.items(), key=lambda kv: (-kv[1].bytes, kv[0])):
        r = min(range(world), key=lambda k: (load[k], k))
        load[r] += f.bytes
        if r == rank:
            mine.append(name)
    return mine


def _sum_or_error(path: Path) -> FileSum | str:
    try:
        return file_sum(path)
    except OSError as exc:
        return str(exc.strerror)
