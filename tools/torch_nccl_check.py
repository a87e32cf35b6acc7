#!/usr/bin/env python3
"""PyTorch's own NCCL backend running on braid's libnccl.so.2 in place of
NVIDIA's:

    LD_PRELOAD=build-gpu/lib/libnccl.so.2 python3 tools/torch_nccl_check.py \\
        --braid-lib build-gpu/lib --expect-braid
    python3 tools/torch_nccl_check.py --backend gloo --device cpu [--braid-lib DIR]

Two ranks, each a process (this program started twice more), meeting
through a file:// store, both on one device (cuda:0): braid lets several
ranks share a GPU, which NVIDIA's NCCL refuses. With --backend gloo
--device cpu the same checks run without NCCL or a GPU, so that they are
themselves tested on any machine. The checks:

1. all_reduce of known values, exact: rank r holds (r + 1) * i at index i
   (float32 and int32; 1, 1000 and 2^20 elements), so both ranks must end
   with 3 * i (every value is an integer below 2^24).
2. One DDP step of a small MLP, each rank on its own batch: both ranks end
   with the same parameters, bit for bit (each writes them to a file, which
   this process compares), and equal (to float32 rounding) to one step of
   the same model in this process on the gradient averaged over both
   batches.
3. The library: each rank prints every libnccl it has mapped
   (/proc/self/maps) and the one its NCCL calls go to (the global scope's
   ncclCommInitRank, through dladdr: torch may map NVIDIA's too, by path,
   but LD_PRELOAD puts braid's first); with --expect-braid, calls that go
   to a library outside --braid-lib, or to none, fail.

With --braid-lib it first prints the NCCL functions torch's CUDA library
imports that braid's libnccl.so.2 does not define (where nm is present):
Python loads libraries with RTLD_NOW, so with braid's library preloaded
torch cannot even be imported while one is missing.

Exit status: 0 when every check passed; 1 naming the first that failed;
77 (skip) where torch cannot run the backend or the device here (no CUDA,
no NCCL in torch), saying why.
"""
import argparse
import datetime
import os
import subprocess
import sys
import tempfile

SKIP = 77
RANKS = 2


def fail(what):
    print(f"error: {what}", flush=True)
    sys.exit(1)


def nccl_called():
    """The library whose ncclCommInitRank the process's global scope finds:
    the one torch's NCCL calls are bound to (LD_PRELOAD puts braid's first,
    even where torch also loads NVIDIA's by path), or "" where none is."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

    try:
        function = ctypes.CDLL(None).ncclCommInitRank
    except AttributeError:
        return ""
    info = DlInfo()
    libc = ctypes.CDLL("libc.so.6")
    address = ctypes.cast(function, ctypes.c_void_p)
    if not libc.dladdr(address, ctypes.byref(info)) or not info.fname:
        return ""
    return os.path.realpath(info.fname.decode())


def mapped_nccl():
    """The paths of every libnccl this process has mapped."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "libnccl" in os.path.basename(fields[5]):
                paths.add(os.path.realpath(fields[5]))
    return sorted(paths)


def model_and_batch(rank):
    """The same model on every rank (seed 0), and rank's own batch."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(100 + rank)
    return model, torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def check_all_reduce(rank, device):
    import torch
    import torch.distributed as dist

    for dtype in (torch.float32, torch.int32):
        for n in (1, 1000, 1 << 20):
            x = torch.arange(n, dtype=dtype, device=device) * (rank + 1)
            dist.all_reduce(x)
            want = torch.arange(n, dtype=dtype) * sum(r + 1 for r in range(RANKS))
            got = x.cpu()
            if not torch.equal(got, want):
                bad = (got != want).nonzero()[0].item()
                fail(f"rank {rank}: all_reduce of {n} x {dtype}: index {bad} is "
                     f"{got[bad].item()}, not {want[bad].item()}")
    print(f"rank {rank}: all_reduce of 1, 1000 and 2^20 float32 and int32: exact", flush=True)


def ddp_step(rank, device, out):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    model, x, y = model_and_batch(rank)
    model = model.to(device)
    ddp = DistributedDataParallel(model,
                                  device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device)).backward()
    opt.step()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()},
               os.path.join(out, f"params{rank}.pt"))
    print(f"rank {rank}: one DDP step done", flush=True)


def rank_main(args):
    import torch
    import torch.distributed as dist

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=args.store, rank=args.rank,
                            world_size=RANKS, timeout=datetime.timedelta(seconds=args.timeout))
    check_all_reduce(args.rank, device)
    ddp_step(args.rank, device, args.out)
    if device.type == "cuda":
        torch.cuda.synchronize()
    libs = mapped_nccl()
    called = nccl_called()
    print(f"rank {args.rank}: libnccl mapped: {', '.join(libs) or 'none'}; NCCL calls go to "
          f"{called or 'none'}", flush=True)
    with open(os.path.join(args.out, f"maps{args.rank}.txt"), "w") as f:
        f.write("\n".join([called] + libs))
    dist.destroy_process_group()
    return 0


def unavailable(args):
    """Why torch cannot run this backend on this device here, or None. A
    torch that is installed but cannot be imported (e.g. a libnccl.so.2
    preloaded that lacks a function torch links: Python loads libraries
    with RTLD_NOW) is a failure, not a skip."""
    try:
        import torch
        import torch.distributed as dist
    except ModuleNotFoundError as error:
        return f"cannot import torch with {sys.executable}: {error}"
    except (ImportError, OSError) as error:
        fail(f"torch is installed but cannot be imported: {error}")
    if args.device == "cuda" and not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: "
                f"{torch.cuda.device_count()} device(s)")
    if args.backend == "nccl" and not dist.is_nccl_available():
        return f"torch {torch.__version__} was built without NCCL"
    if args.backend == "gloo" and not dist.is_gloo_available():
        return f"torch {torch.__version__} was built without Gloo"
    return None


def missing_symbols(braid_lib):
    """The ncclXxx that torch's CUDA library imports and the libnccl.so.2 in
    braid_lib lacks (a line saying so), or why it cannot tell."""
    import torch

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    nccl = os.path.join(braid_lib, "libnccl.so.2")
    if not os.path.exists(torch_lib) or not os.path.exists(nccl):
        return f"symbols: not compared ({torch_lib} or {nccl} is absent)"
    try:
        def names(*args):
            text = subprocess.run(["nm", "-D", *args], capture_output=True, text=True,
                                  check=True).stdout
            return {f.split("@")[0] for line in text.splitlines() for f in line.split()[-1:]
                    if f.startswith("nccl")}
        wanted, defined = names("--undefined-only", torch_lib), names("--defined-only", nccl)
    except (OSError, subprocess.CalledProcessError) as error:
        return f"symbols: not compared (nm: {error})"
    lacking = sorted(wanted - defined)
    return (f"symbols: libtorch_cuda imports {len(wanted)} nccl functions; braid's library lacks "
            f"{len(lacking)}{': ' + ' '.join(lacking) if lacking else ''}")


def reference_step():
    """One SGD step in this process on the gradient averaged over every
    rank's batch: what DDP must give."""
    import torch

    model, _, _ = model_and_batch(0)
    grads = [torch.zeros_like(p) for p in model.parameters()]
    for rank in range(RANKS):
        copy, x, y = model_and_batch(rank)
        torch.nn.functional.mse_loss(copy(x), y).backward()
        for g, p in zip(grads, copy.parameters()):
            g += p.grad / RANKS
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p -= 0.1 * g
    return {k: v.detach() for k, v in model.state_dict().items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--braid-lib", help="braid's library folder (its libnccl.so.2's "
                        "functions are compared with those torch imports)")
    parser.add_argument("--expect-braid", action="store_true",
                        help="fail unless every libnccl the ranks map is from --braid-lib")
    parser.add_argument("--timeout", type=int, default=120, help="seconds for the whole run")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        return rank_main(args)

    why = unavailable(args)
    if why:
        print(f"skip: {why}")
        return SKIP
    import torch

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), backend {args.backend} on "
          f"{args.device}, {RANKS} ranks on one device; "
          f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}")
    if args.expect_braid and not args.braid_lib:
        parser.error("--expect-braid needs --braid-lib")
    if args.braid_lib:
        args.braid_lib = os.path.realpath(args.braid_lib)
        print(missing_symbols(args.braid_lib), flush=True)

    with tempfile.TemporaryDirectory(prefix="torch-nccl-check.") as out:
        store = f"file://{out}/store"
        ranks = [subprocess.Popen([sys.executable, __file__, "--backend", args.backend,
                                   "--device", args.device, "--timeout", str(args.timeout),
                                   "--rank", str(r), "--store", store, "--out", out])
                 for r in range(RANKS)]
        for r, p in enumerate(ranks):
            try:
                status = p.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                for q in ranks:
                    q.kill()
                fail(f"rank {r} still running after {args.timeout} s (killed)")
            if status != 0:
                for q in ranks:
                    q.kill()
                fail(f"rank {r} exited with status {status}")

        params = [torch.load(os.path.join(out, f"params{r}.pt")) for r in range(RANKS)]
        for name, value in params[0].items():
            if not torch.equal(value, params[1][name]):
                fail(f"after the DDP step the ranks' {name} differ by up to "
                     f"{(value - params[1][name]).abs().max().item():.3g}")
        for name, value in reference_step().items():
            if not torch.allclose(params[0][name], value, rtol=1e-4, atol=1e-6):
                fail(f"after the DDP step {name} is off the averaged-gradient step by "
                     f"{(params[0][name] - value).abs().max().item():.3g}")
        print(f"DDP: both ranks' {len(params[0])} parameter tensors are identical and match "
              "the averaged-gradient step")

        libs, called = set(), set()
        for r in range(RANKS):
            with open(os.path.join(out, f"maps{r}.txt")) as f:
                lines = f.read().split("\n")
            called.add(lines[0])
            libs.update(line for line in lines[1:] if line)
        print(f"libnccl mapped by the ranks: {', '.join(sorted(libs)) or 'none'}")
        print(f"the ranks' NCCL calls go to: {', '.join(sorted(called)) or 'none'}")
        if args.expect_braid:
            strays = [lib for lib in called if os.path.dirname(lib) != args.braid_lib]
            if strays:
                fail(f"torch's NCCL calls go to {', '.join(strays) or 'no library'}, not to "
                     f"{args.braid_lib}")
    print(f"pass: all_reduce exact, DDP step identical on both ranks, libnccl "
          f"{'braid' + chr(39) + 's' if args.expect_braid else 'not checked'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
