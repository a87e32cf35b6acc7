#!/usr/bin/env python3
"""torch.distributed on CPU: the "braid" backend next to "gloo", 2 ranks.

    PYTHONPATH=build/python python3 benchmarks/torch_ddp.py
        [--quick] [--warmup N] [--steps N] [--sweep-seconds S] [--json FILE]

Launches 2 ranks on this host (torch.multiprocessing, spawn), each with one
intra-op and one inter-op thread, meeting over tcp://127.0.0.1 on a free
port. Each rank holds a "braid" group and a "gloo" group over both ranks,
plus a third (gloo) group that carries only the benchmark's own barriers and
checks. Every timed call starts after a barrier; each rank times its own
calls with time.perf_counter, and the tables show the slowest rank's median.

The configurations are interleaved, round by round (step i of every
configuration, in an order that rotates each round, before step i + 1 of
any), so that a stretch of slow machine time lands on all of them alike
instead of on whichever happened to run then.

1. DDP training step. An MLP of 8 Linear(1024, 1024) layers with a ReLU
   between them (8,396,800 float32 parameters, 33.6 MB), MSE loss, SGD
   (lr 1e-3). One step = zero_grad, forward, backward, optimizer step, on
   batches of 8 and 64 rows (each rank its own data), wrapped in
   DistributedDataParallel(bucket_cap_mb = 1, 25, 100) over either
   backend; --warmup rounds first (DDP rebuilds its buckets after the
   first step), then --steps measured rounds.
   - "no comm" is the same step on both processes at once, without DDP or
     any collective: they compete for the same 2 cores, as under DDP.
   - "exposed" = DDP step - no-comm step: the communication the backward
     pass did not hide, plus what sharing the cores with the backend's
     threads costs the compute.
   - The bare all-reduce of all gradients, outside any training step, two
     ways: "per param" issues one async dist.all_reduce per parameter's
     gradient (16 tensors: 8 of 4 MiB, 8 of 4 KiB) and then waits for all;
     "flat" is one dist.all_reduce of a single 33.6 MB buffer.
   - The FSDP2 step: the same model with each Linear and the whole model
     under fully_shard on a 1-D DeviceMesh over the backend's group
     (parameters all-gathered before each layer's forward and backward,
     gradients reduce-scattered after), same batches; "exposed" = FSDP2
     step - no-comm step.
   - Checks: after training, both ranks must hold identical parameters in
     every configuration, and the braid-trained model must equal the
     gloo-trained one (same seeds, data and bucket size).
2. dist.all_reduce (sum, float32, in place, synchronous) from 8 B to 64 MiB
   in powers of 2: median time per call over an iteration count calibrated
   to about --sweep-seconds per size and backend (run in 5 alternating
   chunks, each after QUIET_S of quiet: Gloo's threads stay busy for a
   while after its calls, and on 2 cores what they leave behind slows
   whichever backend's chunk comes next), algbw = bytes / time, and busbw = algbw * 2(n-1)/n
   (nccl-tests' convention; with n = 2 ranks busbw equals algbw). The first
   and last call of each size are checked: ranks fill in rank + 1, and the
   sum must be 3 in every element.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

WORLD_SIZE = 2
BACKENDS = ("braid", "gloo")
LAYERS = 8
WIDTH = 1024
BATCHES = (8, 64)
BUCKETS_MB = (1, 25, 100)
SWEEP_BYTES = [1 << k for k in range(3, 27)]  # 8 B .. 64 MiB
QUICK_SWEEP_BYTES = [1 << k for k in range(3, 21, 4)]  # 8 B .. 512 KiB, x16
SWEEP_CHUNKS = 5
QUIET_S = 0.02  # idle time before each timed chunk of the sweep
RUN_TIMEOUT_S = 1800


# ---------------------------------------------------------------- model


def make_mlp():
    torch.manual_seed(0)
    layers = []
    for i in range(LAYERS):
        layers.append(torch.nn.Linear(WIDTH, WIDTH))
        if i + 1 < LAYERS:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def make_batches(rank, batch, count):
    generator = torch.Generator().manual_seed(1000 + rank)
    return [
        (torch.randn(batch, WIDTH, generator=generator), torch.randn(batch, WIDTH, generator=generator))
        for _ in range(count)
    ]


def train_step(model, optimizer, inputs, targets):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()


def flat_parameters(model):
    """Every parameter, whole (an FSDP2 model's shards gathered)."""
    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().reshape(-1)
                      for p in model.parameters()])


def make_fsdp2(group):
    model = make_mlp()
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


# ---------------------------------------------------------------- timing helpers


def timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def rotated(items, by):
    by %= len(items)
    return items[by:] + items[:by]


def agreed_max(value, control):
    tensor = torch.tensor([float(value)])
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=control)
    return tensor.item()


def ranks_agree(tensor, control):
    high, low = tensor.clone(), tensor.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=control)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=control)
    return torch.equal(high, low)


# ---------------------------------------------------------------- DDP step


def build_training_runs(groups, opts):
    """Every configuration to train: the no-comm step per batch, then DDP per backend and bucket size."""
    runs = []
    for batch in opts.batches:
        runs.append({"kind": "no_comm", "batch": batch, "model": make_mlp()})
        for bucket_mb in opts.buckets_mb:
            for backend in BACKENDS:
                model = DistributedDataParallel(make_mlp(), bucket_cap_mb=bucket_mb, process_group=groups[backend])
                runs.append({"kind": "ddp", "backend": backend, "batch": batch, "bucket_mb": bucket_mb, "model": model})
        for backend in BACKENDS:
            runs.append({"kind": "fsdp2", "backend": backend, "batch": batch, "bucket_mb": None,
                         "model": make_fsdp2(groups[backend])})
    for run in runs:
        run["optimizer"] = torch.optim.SGD(run["model"].parameters(), lr=1e-3)
        run["times"] = []
    return runs


def measure_training(rank, groups, control, opts):
    runs = build_training_runs(groups, opts)
    data = {batch: make_batches(rank, batch, opts.warmup + opts.steps) for batch in opts.batches}
    for step in range(opts.warmup + opts.steps):
        for run in rotated(runs, step):
            inputs, targets = data[run["batch"]][step]
            dist.barrier(group=control)
            seconds = timed(lambda: train_step(run["model"], run["optimizer"], inputs, targets))
            if step >= opts.warmup:
                run["times"].append(seconds)
    return check_training(runs, control)


def check_training(runs, control):
    """Raises unless the ranks agree; returns the runs' times and braid's distance to gloo."""
    final = {}
    for run in runs:
        if run["kind"] == "no_comm":
            continue
        model = run["model"].module if run["kind"] == "ddp" else run["model"]
        params = flat_parameters(model)
        where = f"{run['kind']} {run['backend']} batch {run['batch']} bucket_cap_mb {run['bucket_mb']}"
        if not ranks_agree(params, control):
            raise RuntimeError(f"{where}: the ranks' parameters differ after training")
        final[(run["kind"], run["backend"], run["batch"], run["bucket_mb"])] = params
    results = []
    for run in runs:
        entry = {key: run.get(key) for key in ("kind", "backend", "batch", "bucket_mb", "times")}
        if run["kind"] != "no_comm" and run["backend"] == "braid":
            braid = final[(run["kind"], "braid", run["batch"], run["bucket_mb"])]
            gloo = final[(run["kind"], "gloo", run["batch"], run["bucket_mb"])]
            entry["max_abs_diff_to_gloo"] = (braid - gloo).abs().max().item()
        results.append(entry)
    return results


# ---------------------------------------------------------------- bare gradient all-reduce


def measure_gradient_allreduce(rank, groups, control, opts):
    model = make_mlp()
    inputs, targets = make_batches(rank, BATCHES[0], 1)[0]
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    grads = {backend: [p.grad.clone() for p in model.parameters()] for backend in BACKENDS}
    flats = {backend: torch.cat([g.reshape(-1) for g in grads[backend]]) for backend in BACKENDS}

    def per_param(backend):
        works = [dist.all_reduce(g, group=groups[backend], async_op=True) for g in grads[backend]]
        for work in works:
            work.wait()

    def flat(backend):
        dist.all_reduce(flats[backend], group=groups[backend])

    ways = [(backend, name, call) for backend in BACKENDS for name, call in (("per_param", per_param), ("flat", flat))]
    times = {backend: {"per_param": [], "flat": []} for backend in BACKENDS}
    for step in range(opts.warmup + opts.steps):
        for backend, name, call in rotated(ways, step):
            dist.barrier(group=control)
            seconds = timed(lambda: call(backend))
            if step >= opts.warmup:
                times[backend][name].append(seconds)
    some = flats[BACKENDS[0]]
    return {"tensors": len(grads[BACKENDS[0]]), "bytes": some.numel() * some.element_size(), "times": times}


# ---------------------------------------------------------------- all_reduce sweep


def check_allreduce(tensor, rank, group, where):
    tensor.fill_(rank + 1)
    dist.all_reduce(tensor, group=group)
    expected = float(sum(r + 1 for r in range(WORLD_SIZE)))
    wrong = (tensor != expected).nonzero()
    if len(wrong):
        first = wrong[0].item()
        raise RuntimeError(
            f"{where}: {len(wrong)} wrong elements; element {first} is {tensor[first].item()}, expected {expected}"
        )
    tensor.zero_()


def calibrated_iterations(tensor, group, control, opts):
    """Calls to make for about opts.sweep_seconds, the same on both ranks."""
    for _ in range(2):
        dist.all_reduce(tensor, group=group)
    probe = statistics.median(timed(lambda: dist.all_reduce(tensor, group=group)) for _ in range(3))
    per_call = agreed_max(probe, control)
    return int(min(opts.sweep_max_iters, max(opts.sweep_min_iters, opts.sweep_seconds / per_call)))


def measure_allreduce_sweep(rank, groups, control, opts):
    results = []
    for size_bytes in opts.sweep_bytes:
        tensors = {backend: torch.zeros(max(1, size_bytes // 4)) for backend in BACKENDS}
        chunk = {}
        for backend in BACKENDS:
            dist.barrier(group=control)
            check_allreduce(tensors[backend], rank, groups[backend], f"{backend} all_reduce of {size_bytes} B, first call")
            iterations = calibrated_iterations(tensors[backend], groups[backend], control, opts)
            chunk[backend] = -(-iterations // SWEEP_CHUNKS)
        times = {backend: [] for backend in BACKENDS}
        for round_ in range(SWEEP_CHUNKS):
            for backend in rotated(list(BACKENDS), round_):
                tensor, group = tensors[backend], groups[backend]
                dist.barrier(group=control)
                time.sleep(QUIET_S)
                dist.barrier(group=control)
                dist.all_reduce(tensor, group=group)  # absorbs the skew of leaving the barrier
                times[backend] += [timed(lambda: dist.all_reduce(tensor, group=group)) for _ in range(chunk[backend])]
        for backend in BACKENDS:
            check_allreduce(tensors[backend], rank, groups[backend], f"{backend} all_reduce of {size_bytes} B, last call")
        results.append({"bytes": size_bytes, "times": times})
    return results


# ---------------------------------------------------------------- ranks


def rank_main(rank, port, opts, out_dir):
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import braid_torch  # noqa: F401  (registers the "braid" backend)

    timeout = datetime.timedelta(seconds=opts.op_timeout)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE, timeout=timeout
    )
    control = dist.group.WORLD
    groups = {backend: dist.new_group(backend=backend, timeout=timeout) for backend in BACKENDS}
    result = {
        "training": measure_training(rank, groups, control, opts),
        "gradient_allreduce": measure_gradient_allreduce(rank, groups, control, opts),
        "sweep": measure_allreduce_sweep(rank, groups, control, opts),
    }
    dist.barrier(group=control)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as out:
        json.dump(result, out)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(opts):
    """Runs rank_main on WORLD_SIZE fresh processes; returns their results by rank."""
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.spawn(rank_main, args=(free_port(), opts, out_dir), nprocs=WORLD_SIZE, join=False)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the ranks did not finish within {RUN_TIMEOUT_S} s")
        ranks = []
        for r in range(WORLD_SIZE):
            with open(os.path.join(out_dir, f"rank{r}.json")) as result:
                ranks.append(json.load(result))
        return ranks


# ---------------------------------------------------------------- report


def slowest_median(per_rank_times):
    return max(statistics.median(times) for times in per_rank_times)


def slowest_min(per_rank_times):
    return max(min(times) for times in per_rank_times)


def summarize(ranks, opts):
    def training_times(kind, batch, backend=None, bucket_mb=None):
        for i, run in enumerate(ranks[0]["training"]):
            if (run["kind"], run["batch"], run["backend"], run["bucket_mb"]) == (kind, batch, backend, bucket_mb):
                per_rank = [rank["training"][i]["times"] for rank in ranks]
                return slowest_median(per_rank), slowest_min(per_rank), run

    summary = {"ddp": [], "fsdp2": [], "gradient_allreduce": {}, "sweep": []}
    for batch in opts.batches:
        no_comm, no_comm_min, _ = training_times("no_comm", batch)
        for bucket_mb in opts.buckets_mb:
            row = {"batch": batch, "bucket_mb": bucket_mb, "no_comm_s": no_comm, "no_comm_min_s": no_comm_min}
            for backend in BACKENDS:
                step, step_min, run = training_times("ddp", batch, backend, bucket_mb)
                row[backend] = {
                    "step_s": step,
                    "exposed_s": step - no_comm,
                    "step_min_s": step_min,
                    "exposed_min_s": step_min - no_comm_min,
                }
                if "max_abs_diff_to_gloo" in run:
                    row["braid_vs_gloo_max_abs_diff"] = run["max_abs_diff_to_gloo"]
            summary["ddp"].append(row)
        row = {"batch": batch, "no_comm_s": no_comm, "no_comm_min_s": no_comm_min}
        for backend in BACKENDS:
            step, step_min, run = training_times("fsdp2", batch, backend)
            row[backend] = {"step_s": step, "exposed_s": step - no_comm, "step_min_s": step_min,
                            "exposed_min_s": step_min - no_comm_min}
            if "max_abs_diff_to_gloo" in run:
                row["braid_vs_gloo_max_abs_diff"] = run["max_abs_diff_to_gloo"]
        summary["fsdp2"].append(row)

    grads = ranks[0]["gradient_allreduce"]
    for backend in BACKENDS:
        summary["gradient_allreduce"][backend] = {
            "tensors": grads["tensors"],
            "bytes": grads["bytes"],
            **{
                f"{way}_s": slowest_median([rank["gradient_allreduce"]["times"][backend][way] for rank in ranks])
                for way in ("per_param", "flat")
            },
        }

    bus_factor = 2 * (WORLD_SIZE - 1) / WORLD_SIZE
    for i, size_bytes in enumerate(opts.sweep_bytes):
        row = {"bytes": size_bytes}
        for backend in BACKENDS:
            seconds = slowest_median([rank["sweep"][i]["times"][backend] for rank in ranks])
            algbw = size_bytes / seconds / 1e9
            row[backend] = {
                "time_s": seconds,
                "calls": len(ranks[0]["sweep"][i]["times"][backend]),
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * bus_factor,
            }
        summary["sweep"].append(row)
    return summary


def human_bytes(size):
    for unit in ("B", "KiB", "MiB"):
        if size < 1024 or unit == "MiB":
            return f"{size:g} {unit}"
        size /= 1024


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds):
    return f"{seconds * 1e3:.2f}"


def print_ddp_table(summary, machine, opts):
    print(
        f"### DDP step, MLP {LAYERS} x Linear({WIDTH}, {WIDTH}) + ReLU "
        f"({machine['parameters']:,} parameters), SGD\n"
    )
    print(
        f"Median ms per step (slowest rank) over {opts.steps} measured rounds after {opts.warmup} warm-up, "
        "all configurations interleaved. no comm = the same step on both processes at once without DDP; "
        "exposed = DDP - no comm.\n"
    )
    header = ["batch", "bucket_cap_mb", "no comm"]
    for backend in BACKENDS:
        header += [f"{backend} DDP", f"{backend} exposed"]

    def ddp_rows(suffix):
        rows = []
        for row in summary["ddp"]:
            cells = [str(row["batch"]), str(row["bucket_mb"]), ms(row[f"no_comm{suffix}_s"])]
            for backend in BACKENDS:
                cells += [ms(row[backend][f"step{suffix}_s"]), ms(row[backend][f"exposed{suffix}_s"])]
            rows.append(cells)
        return rows

    print(table(header, ddp_rows("")))
    print(
        "\nThe same, fastest step instead of the median (the slowest rank's minimum), "
        "less sensitive to stretches of slow machine time:\n"
    )
    print(table(header, ddp_rows("_min")))
    print("\n### FSDP2 step (fully_shard per Linear and on the model, 1-D mesh), same model and batches\n")
    header = ["batch", "no comm"]
    for backend in BACKENDS:
        header += [f"{backend} FSDP2", f"{backend} exposed"]
    for suffix, what in (("", "median"), ("_min", "fastest")):
        rows = []
        for row in summary["fsdp2"]:
            cells = [str(row["batch"]), ms(row[f"no_comm{suffix}_s"])]
            for backend in BACKENDS:
                cells += [ms(row[backend][f"step{suffix}_s"]), ms(row[backend][f"exposed{suffix}_s"])]
            rows.append(cells)
        print(f"{what} ms per step (slowest rank):\n")
        print(table(header, rows))
        print()
    worst = max(row["braid_vs_gloo_max_abs_diff"] for row in summary["ddp"] + summary["fsdp2"])
    print(
        "Checks passed: both ranks held identical parameters after every DDP and FSDP2 run; "
        f"max |braid - gloo| over the trained parameters of each configuration: {worst:.3g}.\n"
    )


def print_gradient_table(summary, opts):
    grads = summary["gradient_allreduce"][BACKENDS[0]]
    print("### Bare all-reduce of all gradients (no training step)\n")
    print(
        f"Median ms per round (slowest rank) over {opts.steps} rounds after {opts.warmup} warm-up. "
        f"per param: {grads['tensors']} async dist.all_reduce calls, one per parameter's gradient, then "
        f"wait for all; flat: one dist.all_reduce of a {grads['bytes'] / 1e6:.1f} MB buffer.\n"
    )
    rows = [
        [backend, ms(summary["gradient_allreduce"][backend]["per_param_s"]), ms(summary["gradient_allreduce"][backend]["flat_s"])]
        for backend in BACKENDS
    ]
    print(table(["backend", "per param", "flat"], rows))
    print()


def braid_perf_times(opts):
    """braid-perf's in-place all-reduce time per size (µs, mean per call, the
    slowest rank's: nccl-tests' convention) at the same sizes and ranks, run
    right after the torch sweep; {} where braid-perf is not built."""
    run, perf = os.path.join(opts.bin, "braid-run"), os.path.join(opts.bin, "braid-perf")
    if not (os.access(run, os.X_OK) and os.access(perf, os.X_OK)):
        return {}
    low, high = min(opts.sweep_bytes), max(opts.sweep_bytes)
    done = subprocess.run([run, "-n", str(WORLD_SIZE), perf, "allreduce", "-b", str(low), "-e", str(high),
                           "-f", "2", "-w", "5", "-n", "50"], capture_output=True, text=True, timeout=600)
    times = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 13 and fields[0].isdigit():  # size count type op root | time algbw busbw wrong (out, in place)
            times[int(fields[0])] = float(fields[9])
    return times


def print_sweep_table(summary, opts):
    print("### dist.all_reduce, float32 sum, in place\n")
    print(
        f"Median µs per call (slowest rank); calls per size and backend calibrated to ~{opts.sweep_seconds:g} s "
        f"({opts.sweep_min_iters}..{opts.sweep_max_iters}, in {SWEEP_CHUNKS} chunks alternating with the other "
        f"backend, each after {QUIET_S * 1000:g} ms idle); algbw = bytes / time, busbw = algbw * 2(n-1)/n = algbw for n = {WORLD_SIZE}; "
        "GB/s = 1e9 B/s.\n"
    )
    perf = summary.get("braid_perf_us", {})
    if perf:
        print("braid-perf µs: `braid-run -n 2 braid-perf allreduce` in place at the same sizes, run right after "
              "(mean per call of the slowest rank, back to back); ratio = braid µs / braid-perf µs.\n")
    header = ["size"]
    for backend in BACKENDS:
        header += [f"{backend} µs", f"{backend} algbw GB/s", f"{backend} busbw GB/s"]
        if backend == "braid" and perf:
            header += ["braid-perf µs", "ratio"]
    rows = []
    for row in summary["sweep"]:
        cells = [human_bytes(row["bytes"])]
        for backend in BACKENDS:
            entry = row[backend]
            cells += [f"{entry['time_s'] * 1e6:.1f}", f"{entry['algbw_GBps']:.3g}", f"{entry['busbw_GBps']:.3g}"]
            if backend == "braid" and perf:
                bare = perf.get(str(row["bytes"])) or perf.get(row["bytes"])
                cells += [f"{bare:.1f}", f"{entry['time_s'] * 1e6 / bare:.2f}"] if bare else ["", ""]
        rows.append(cells)
    print(table(header, rows))


def print_report(summary, machine, opts):
    print(f"## torch.distributed, {WORLD_SIZE} ranks on one host: braid vs gloo\n")
    print(
        f"{machine['cpu']}, {machine['nproc']} CPUs; torch {machine['torch']}, Python {machine['python']}; "
        "one thread per rank (torch.set_num_threads(1)).\n"
    )
    print_ddp_table(summary, machine, opts)
    print_gradient_table(summary, opts)
    print_sweep_table(summary, opts)


def machine_info():
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "nproc": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "parameters": sum(p.numel() for p in make_mlp().parameters()),
    }


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run: few steps, one bucket size, small sweep")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default 5, quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="measured rounds (default 30, quick 3)")
    parser.add_argument("--sweep-seconds", type=float, default=None, help="all_reduce time per size and backend")
    parser.add_argument("--op-timeout", type=float, default=120, help="process-group timeout, seconds")
    parser.add_argument("--json", metavar="FILE", help="also write the summary and every rank's raw times as JSON")
    parser.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin"),
                        help="where braid-run and braid-perf are (for the braid-perf column; default build/bin)")
    opts = parser.parse_args()
    opts.warmup = opts.warmup if opts.warmup is not None else (1 if opts.quick else 5)
    opts.steps = opts.steps if opts.steps is not None else (3 if opts.quick else 30)
    opts.sweep_seconds = opts.sweep_seconds or (0.02 if opts.quick else 0.5)
    opts.sweep_min_iters = SWEEP_CHUNKS if opts.quick else 10
    opts.sweep_max_iters = 50 if opts.quick else 1000
    opts.sweep_bytes = QUICK_SWEEP_BYTES if opts.quick else SWEEP_BYTES
    opts.batches = BATCHES
    opts.buckets_mb = (25,) if opts.quick else BUCKETS_MB
    return opts


def main():
    opts = parse_args()
    started = time.monotonic()
    ranks = run_ranks(opts)
    summary = summarize(ranks, opts)
    summary["braid_perf_us"] = braid_perf_times(opts)
    machine = machine_info()
    print_report(summary, machine, opts)
    print(f"\n(total {time.monotonic() - started:.0f} s)", file=sys.stderr)
    if opts.json:
        options = {key: value for key, value in vars(opts).items() if key != "json"}
        with open(opts.json, "w") as out:
            json.dump({"machine": machine, "options": options, "summary": summary, "raw": ranks}, out, indent=1)


if __name__ == "__main__":
    main()
