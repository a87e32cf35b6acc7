"""Runs a test body on N ranks, each a process with the default group on
backend "braid" and a second group on "gloo" over the same ranks.

A test script calls main(body, nranks); body(rank, size, gloo) runs on every
rank. The script exits 0 when every rank passed, 1 naming each rank that
failed (and why), and 77 (CTest's skip) when torch or braid_torch cannot be
imported, saying why.
"""
import os
import socket
import sys
import traceback

SKIP = 77


def _importable():
    try:
        import torch  # noqa: F401
        import braid_torch  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, size, port, body, failures, timeout_s, finish):
    import datetime

    import faulthandler

    import torch
    import torch.distributed as dist
    import braid_torch  # noqa: F401

    faulthandler.enable()  # a crash prints where each thread was
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "braid",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        gloo = dist.new_group(backend="gloo")
        body(rank, size, gloo)
        if finish:
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:  # noqa: B902  (a rank reports whatever stopped it)
        failures[rank] = traceback.format_exc()
        raise SystemExit(1)


def main(body, nranks, timeout_s=60, finish=True):
    """`finish`: after the body, a barrier and destroy_process_group() (a
    body that tears the group down itself passes False)."""
    why = _importable()
    if why:
        print(f"skipped: cannot import torch and braid_torch with {sys.executable}: {why}")
        raise SystemExit(SKIP)
    import torch.multiprocessing as mp

    failures = mp.Manager().dict()
    try:
        mp.spawn(
            _rank_main,
            args=(nranks, free_port(), body, failures, timeout_s, finish),
            nprocs=nranks,
            join=True,
        )
    except Exception as error:  # a rank exited non-zero; its reason is in failures
        if not failures:
            print(f"a rank failed: {error}")
            raise SystemExit(1)
    for rank in sorted(failures.keys()):
        print(f"rank {rank} failed:\n{failures[rank]}")
    if failures:
        raise SystemExit(1)
    print(f"passed at {nranks} ranks")


def ranks_from_argv(default=2):
    return int(sys.argv[1]) if len(sys.argv) > 1 else default


def ring_exchange(mine, got, rank, size):
    """Blocking send of `mine` to the right neighbour and receive of `got`
    from the left one, ordered so that no rank waits on another's send.
    Returns the left neighbour."""
    import torch.distributed as dist

    right, left = (rank + 1) % size, (rank - 1) % size
    if rank % 2 == 0:
        dist.send(mine, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(mine, right)
    return left


def check(condition, message):
    if not condition:
        raise AssertionError(message)


os.environ.setdefault("BRAID_LOG_LEVEL", "warn")
