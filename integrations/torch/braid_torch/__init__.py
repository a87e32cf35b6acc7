"""torch.distributed backend "braid".

    import braid_torch  # registers the backend
    torch.distributed.init_process_group("braid", ...)

Collectives on CPU tensors run on braid's progress thread; every call
returns a Work whose future completes without anyone calling wait().
"""
import torch  # loads libtorch before the extension
import torch.distributed as dist

from ._built_for import TORCH_VERSION as _BUILT_FOR

if torch.__version__ != _BUILT_FOR:
    # The extension would fail on torch's symbols, naming neither version.
    raise ImportError(
        f"braid_torch was built for torch {_BUILT_FOR}, but this interpreter has torch {torch.__version__}: "
        "build it again for this torch (pip install ./integrations/torch, or CMake with BRAID_TORCH_PYTHON)")

from . import _C  # noqa: E402

__all__ = ["BACKEND"]

BACKEND = "braid"


def _create(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
