"""A checkpoint's DCP `.metadata` read without running code from the workdir.

torch.distributed.checkpoint writes `.metadata` with pickle and its FileSystemReader loads it with
`pickle.load`; a non-tensor entry (BytesStorageMetadata) it loads with `torch.load(weights_only=False)`. Anyone who
can write a checkpoint folder could then run code in every rank that resumes from it: a manifest's sha256 is no
key, it can be recomputed. So orch reads both itself:

- `.metadata` through an unpickler that resolves only the names DCP's metadata is made of (`ALLOWED`: DCP's
  metadata dataclasses, torch's dtypes, `torch.Size`, a layout by name, a path) and refuses any other;
- a non-tensor entry with `torch.load(weights_only=True)` (`SafeLoadPlanner`).

`metadata_problem` checks a `.metadata` torch-free, before any rank starts (runtime/workdir/checkpoint_manifest.py
`verify`): the same names allowed, each resolved to an inert stand-in, so nothing is imported or called.
`reader`, `load_planner` and `read_whole` are what loading uses (runtime/workdir/checkpoint.py, `orch export`);
they import torch, lazily.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

METADATA = ".metadata"
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# fmt: off
_DTYPES = frozenset(
    {
        "bfloat16", "bit", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "bool", "cdouble", "cfloat", "chalf",
        "complex128", "complex32", "complex64", "double", "float", "float16", "float32", "float4_e2m1fn_x2",
        "float64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "half",
        "int", "int1", "int16", "int2", "int3", "int32", "int4", "int5", "int6", "int64", "int7", "int8", "long",
        "qint32", "qint8", "quint2x4", "quint4x2", "quint8", "short", "uint1", "uint16", "uint2", "uint3", "uint32",
        "uint4", "uint5", "uint6", "uint64", "uint7", "uint8",
    }
)  # torch 2.13's dtypes (tests/unit/test_workdir_safety.py checks the list against the installed torch)
# fmt: on
ALLOWED: dict[str, frozenset[str]] = {
    _DCP_METADATA: frozenset(
        {
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),  # a layout looked up by its name ("torch.strided")
    "torch": _DTYPES | {"Size"},
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class UnsafeMetadata(pickle.UnpicklingError):
    """A `.metadata` that names something DCP's metadata is not made of."""


def _refuse(module: str, name: str) -> UnsafeMetadata:
    return UnsafeMetadata(f"names {module}.{name}, which DCP's metadata never holds (not loaded: it could run code)")


def _allowed(module: str, name: str) -> bool:
    return name in ALLOWED.get(module, frozenset())


class _StandIn:
    """What an allowed name resolves to in the torch-free check: takes any arguments and state, does nothing."""

    qualname = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> _StandIn:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _CheckingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise _refuse(module, name)
        return type(name, (_StandIn,), {"qualname": f"{module}.{name}"})

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeMetadata("holds a persistent id, which DCP's metadata never does")


def metadata_problem(path: Path) -> str | None:
    """Why the `.metadata` at `path` cannot be loaded safely (one phrase), None when it is DCP metadata made only of
    the allowed names. Torch-free: nothing it names is imported or called."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "metadata .metadata: missing"
    except OSError as exc:
        return f"metadata .metadata: unreadable ({exc.strerror})"
    try:
        root = _CheckingUnpickler(io.BytesIO(data)).load()
    except UnsafeMetadata as exc:
        return f"metadata .metadata: {exc}"
    except Exception:  # any malformed pickle: the phrase says what matters
        return "metadata .metadata: not DCP metadata (damaged?)"
    if getattr(root, "qualname", None) != f"{_DCP_METADATA}.Metadata":
        return "metadata .metadata: not DCP metadata (damaged?)"
    return None


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise _refuse(module, name)
        found = super().find_class(module, name)
        if module == "torch" and name != "Size":
            import torch

            if not isinstance(found, torch.dtype):
                raise _refuse(module, name)
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeMetadata("holds a persistent id, which DCP's metadata never does")


def load_metadata(stream: Any) -> Any:
    """DCP's Metadata from an open `.metadata`, through the restricted unpickler (UnsafeMetadata otherwise)."""
    from torch.distributed.checkpoint.metadata import Metadata

    metadata = _RestrictedUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeMetadata(f"holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


def reader(folder: str | Path) -> Any:
    """A FileSystemReader of `folder` whose `.metadata` is read by `load_metadata`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                try:
                    metadata = load_metadata(f)
                except UnsafeMetadata as exc:
                    raise UnsafeMetadata(f"{path}: {exc}") from None
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(folder))


def _load_bytes_safely(planner: Any, read_item: Any, value: io.BytesIO) -> None:
    """DefaultLoadPlanner.load_bytes with `weights_only=True`: tensors and plain values, no code."""
    import torch
    from torch.distributed.checkpoint._traverse import set_element

    loaded = torch.load(value, weights_only=True)
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


def load_planner() -> Any:
    """DCP's default load planner, loading a non-tensor entry with `weights_only=True`."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            _load_bytes_safely(self, read_item, value)

    return SafeLoadPlanner()


def read_whole(folder: str | Path) -> dict[str, Any]:
    """The whole checkpoint as nested plain tensors in this process (torch's `dcp_to_torch_save` reads it so, but
    through pickle), for `orch export`."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            _load_bytes_safely(self, read_item, value)

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=reader(folder), planner=SafeEmptyPlanner(), no_dist=True)
    return state
