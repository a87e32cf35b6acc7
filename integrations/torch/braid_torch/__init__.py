"""torch.distributed backend "braid".

    import braid_torch  # registers the backend
    torch.distributed.init_process_group("braid", ...)

Collectives on CPU tensors run on braid's progress thread; every call
returns a Work whose future completes without anyone calling wait().
"""
import inspect

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND"]

BACKEND = "braid"


def _create(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


def _register():
    register = dist.Backend.register_backend
    if "devices" in inspect.signature(register).parameters:  # torch 2.x
        register(BACKEND, _create, devices=["cpu"])
    else:
        register(BACKEND, _create)


_register()
