"""torch.distributed backend "braid".

    import braid_torch  # registers the backend
    torch.distributed.init_process_group("braid", ...)

Calls on CPU tensors run on the group's thread; every call returns a
Work whose future completes without anyone calling wait(). Calls on CUDA
tensors (where the extension was built against a CUDA torch: HAS_CUDA)
are enqueued on torch's current CUDA stream, as NCCL's backend does.
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

__all__ = ["BACKEND", "HAS_CUDA"]

BACKEND = "braid"
HAS_CUDA = _C.HAS_CUDA


def _create(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"] if HAS_CUDA else ["cpu"])
