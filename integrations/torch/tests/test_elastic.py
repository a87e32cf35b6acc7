"""Survivors go on over backend "braid": at 4 ranks a rank is killed
(SIGKILL) during training; the others' collective fails, they call
torch.distributed.shrink_group with SHRINK_ABORT and go on at 3 ranks,
checking every result; a second, planned shrink (SHRINK_DEFAULT) lets a
live rank leave.

    python3 test_elastic.py
"""
import os
import signal
import sys
import time

import harness

SIZE = 4
VICTIM = 1


def rank_main(rank, port, died_at, results):
    import datetime

    import torch
    import torch.distributed as dist
    import braid_torch  # noqa: F401
    from torch.distributed import distributed_c10d as c10d

    torch.set_num_threads(1)
    dist.init_process_group("braid", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=SIZE, timeout=datetime.timedelta(seconds=30))
    try:
        t = torch.ones(1000)
        dist.all_reduce(t)
        assert bool((t == SIZE).all()), f"all_reduce at {SIZE} ranks gave {t[:4]}"
        if rank == VICTIM:
            time.sleep(0.1)
            died_at.value = time.monotonic()
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            for _ in range(100000):
                dist.all_reduce(torch.ones(1000))
            raise AssertionError("no collective failed after the kill")
        except RuntimeError:
            pass
        group = dist.shrink_group([VICTIM], shrink_flags=c10d.SHRINK_ABORT)
        usable_after = time.monotonic() - died_at.value
        size = dist.get_world_size()
        assert size == SIZE - 1 and group.size() == size, f"shrunk to {size}"
        me = dist.get_rank()
        assert me == (rank if rank < VICTIM else rank - 1), f"rank {rank} became {me}"
        t = torch.full((1000,), float(me + 1))
        dist.all_reduce(t)
        want = size * (size + 1) / 2
        assert bool((t == want).all()), f"all_reduce after the shrink gave {t[:4]}, not {want}"
        out = [torch.empty(3) for _ in range(size)]
        dist.all_gather(out, torch.full((3,), float(me)))
        assert [int(o[0]) for o in out] == list(range(size)), f"all_gather gave {out}"
        # A planned shrink: the last rank leaves, alive.
        if me == size - 1:
            dist.destroy_process_group()
            results[rank] = ("left", usable_after)
            return
        dist.shrink_group([size - 1])
        t = torch.ones(10)
        dist.all_reduce(t)
        assert bool((t == size - 1).all()), f"all_reduce after the second shrink gave {t[:4]}"
        dist.destroy_process_group()
        results[rank] = ("ok", usable_after)
    except BaseException as error:  # noqa: B902  (reported to the parent)
        import traceback

        results[rank] = ("failed", traceback.format_exc())
        raise SystemExit(1) from error


def main():
    if harness._importable():
        print(f"skipped: cannot import torch and braid_torch: {harness._importable()}")
        raise SystemExit(harness.SKIP)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    died_at = ctx.Value("d", 0.0)
    results = ctx.Manager().dict()
    port = harness.free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, died_at, results)) for r in range(SIZE)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    failures = []
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            failures.append(f"rank {r} hung")
    if procs[VICTIM].exitcode != -signal.SIGKILL:
        failures.append(f"the victim (rank {VICTIM}) ended with {procs[VICTIM].exitcode}")
    for rank in range(SIZE):
        if rank == VICTIM:
            continue
        kind, detail = results.get(rank, ("failed", "no result"))
        if kind == "failed":
            failures.append(f"rank {rank}:\n{detail}")
        else:
            print(f"rank {rank}: shrunk and usable {detail:.3f} s after the kill; {kind}")
    for failure in failures:
        print(failure)
    if not failures:
        print(f"passed at {SIZE} ranks")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
