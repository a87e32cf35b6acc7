"""What one dist.all_reduce costs before any communication: a group of one
rank (braid, gloo) next to torch's "fake" backend, which does nothing, so
its time is torch's own cost per call. Each runs with torch's flight
recorder as it comes (torch 2.15 hooks it onto third-party backends, braid
among them; Gloo records natively) and with it off (TORCH_FR_BUFFER_SIZE=0).

    PYTHONPATH=build/python python3 benchmarks/torch_call_floor.py [--calls N]

Prints median and fastest µs per call over 5 runs of N calls (8 B float32,
in place), through dist.all_reduce and through the group's allreduce().wait()
(no Python wrapper). Each configuration runs in a process of its own.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

BACKENDS = ("fake", "braid", "gloo")


def measure(backend, calls):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    else:
        import braid_torch  # noqa: F401

        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    tensor = torch.zeros(2)
    group = dist.group.WORLD
    opts = dist.AllreduceOptions()

    def per_call(call):
        for _ in range(calls // 10):
            call()
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                call()
            runs.append((time.perf_counter() - start) / calls * 1e6)
        return statistics.median(runs), min(runs)

    wrapped = per_call(lambda: dist.all_reduce(tensor))
    direct = per_call(lambda: group.allreduce([tensor], opts).wait())
    dist.destroy_process_group()
    print(f"{wrapped[0]:.2f} {wrapped[1]:.2f} {direct[0]:.2f} {direct[1]:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.one:
        measure(opts.one, opts.calls)
        return
    import torch

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}; one process, one thread; "
          f"µs per call, median and fastest of 5 runs of {opts.calls} calls\n")
    print("| backend | flight recorder | dist.all_reduce median | fastest | allreduce().wait() median | fastest |")
    print("|---|---|---:|---:|---:|---:|")
    for backend in BACKENDS:
        for recorder in ("on", "off"):
            env = dict(os.environ)
            if recorder == "off":
                env["TORCH_FR_BUFFER_SIZE"] = "0"
            else:
                env.pop("TORCH_FR_BUFFER_SIZE", None)
                env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
            done = subprocess.run([sys.executable, __file__, "--one", backend, "--calls", str(opts.calls)],
                                  env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{backend} (flight recorder {recorder}) failed:\n{done.stderr}")
            values = done.stdout.split()
            print(f"| {backend} | {recorder} | " + " | ".join(values) + " |")


if __name__ == "__main__":
    main()
