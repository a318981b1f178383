"""The FSDP2 internals the keep mode reads (runtime/parallel/fsdp_private.py) exist as they were checked: a
torch upgrade fails here first, before any equivalence test hangs on a changed collective."""

import pytest
import torch

from orch.runtime.parallel import fsdp_private


def test_torch_is_the_version_the_internals_were_checked_on():
    assert torch.__version__.startswith(fsdp_private.CHECKED_ON + "."), (
        f"torch {torch.__version__}: re-check runtime/parallel/fsdp_private.py against this FSDP2, then update CHECKED_ON"
    )


def _has(cls, name: str) -> bool:
    """A class attribute, or one every instance sets in the class's code (`self.name =`)."""
    import inspect

    return hasattr(cls, name) or f"self.{name} =" in inspect.getsource(cls) or f"self.{name}:" in inspect.getsource(cls)


def test_the_private_attributes_exist():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    assert hasattr(FSDPModule, "_get_fsdp_state")
    for cls, names in ((FSDPState, fsdp_private.STATE_ATTRS), (FSDPParamGroup, fsdp_private.GROUP_ATTRS)):
        missing = [n for n in names if not _has(cls, n)]
        assert not missing, (cls.__name__, missing)
    missing = [n for n in fsdp_private.PARAM_ATTRS if not _has(FSDPParam, n)]
    assert not missing, missing


@pytest.mark.parametrize("name", ["_lazy_init", "_root_post_backward_final_callback"])
def test_state_methods_take_no_arguments(name):
    import inspect

    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    assert list(inspect.signature(getattr(FSDPState, name)).parameters) == ["self"]
