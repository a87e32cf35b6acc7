"""A rank killed (SIGKILL) in the middle of DDP training over backend "braid":
every other rank's next collective raises an error naming it within 2 s,
and nobody hangs.

    /usr/bin/python3 test_rank_death.py [NRANKS]
"""
import os
import signal
import sys
import time

import harness

VICTIM_STEP = 4


def victim_of(size):
    return size - 1


def rank_main(rank, size, port, died_at, results):
    import datetime

    import torch
    import torch.distributed as dist
    import braid_torch  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("braid", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)),
                bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    victim = victim_of(size)
    try:
        for step in range(1000):
            if rank == victim and step == VICTIM_STEP:
                died_at.value = time.monotonic()
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            if died_at.value:
                time.sleep(0.01)  # the survivors go on until their collective fails
        results[rank] = "no collective failed"
    except RuntimeError as error:
        results[rank] = (time.monotonic() - died_at.value, str(error))


def main():
    if harness._importable():
        print(f"skipped: cannot import torch and braid_torch: {harness._importable()}")
        raise SystemExit(harness.SKIP)
    import torch.multiprocessing as mp

    size = harness.ranks_from_argv(3)
    ctx = mp.get_context("spawn")
    died_at = ctx.Value("d", 0.0)
    results = ctx.Manager().dict()
    port = harness.free_port()
    procs = [ctx.Process(target=rank_main, args=(r, size, port, died_at, results)) for r in range(size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 60
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    victim = victim_of(size)
    failures = [f"rank {r} hung" for r in hung]
    if procs[victim].exitcode != -signal.SIGKILL:
        failures.append(f"the victim (rank {victim}) ended with {procs[victim].exitcode}, not SIGKILL")
    for rank in range(size):
        if rank == victim or rank in hung:
            continue
        got = results.get(rank)
        if not isinstance(got, tuple):
            failures.append(f"rank {rank}: {got or 'no result'}")
            continue
        seconds, text = got
        print(f"rank {rank} failed {seconds:.3f} s after the death: {text}")
        if f"peer {victim}" not in text and f"rank {victim}" not in text:
            failures.append(f"rank {rank}'s error does not name rank {victim}: {text}")
        if seconds >= 2.0:
            failures.append(f"rank {rank} failed {seconds:.3f} s after the death (limit 2 s)")
    for failure in failures:
        print(failure)
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
