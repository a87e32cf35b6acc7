"""Calls on CUDA tensors, against the same calls on Gloo with CPU copies of
the inputs, and the stream semantics ProcessGroupNCCL has: ops are ordered
on the caller's current stream, Work.wait() makes the current stream wait
(not the CPU), futures carry the stream's event, and tensors dropped while
their op is queued stay alive until it ran. Rank r uses GPU r % the GPUs
there are (several ranks share a GPU where there are fewer).

    python3 test_cuda.py NRANKS

Skipped (CTest's 77), naming the reason, where torch sees no GPU or
braid_torch was built without CUDA; tools/gpu_check.sh runs it on a GPU.
"""
import copy
import sys
import warnings

warnings.filterwarnings("ignore", message=".*private function.*")

import harness
from harness import check, main, ranks_from_argv, ring_exchange


def device_of(rank):
    import torch

    return torch.device("cuda", rank % torch.cuda.device_count())


def inputs(rank, n, dtype=None, seed=0):
    import torch

    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-8, 9, (n,), generator=g).to(dtype or torch.float32)


def close(got, want, what, bound=1e-6):
    import torch

    got = got.cpu()
    check(got.shape == want.shape and got.dtype == want.dtype,
          f"{what}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}")
    check(torch.allclose(got.double(), want.double(), rtol=bound, atol=bound), f"{what}: {got[:6]} vs {want[:6]}")


def test_collectives(rank, size, gloo):
    """Each call on CUDA tensors equals Gloo's on CPU copies (small integer
    values: every sum is exact)."""
    import torch
    import torch.distributed as dist

    dev = device_of(rank)
    for n in (1, 1000, 1 << 20):
        x = inputs(rank, n)
        got, want = x.to(dev), x.clone()
        dist.all_reduce(got)
        dist.all_reduce(want, group=gloo)
        close(got, want, f"all_reduce of {n}")

        got, want = x.to(dev), x.clone()
        dist.broadcast(got, src=size - 1)
        dist.broadcast(want, src=size - 1, group=gloo)
        close(got, want, f"broadcast of {n}")

        got, want = x.to(dev), x.clone()
        dist.reduce(got, dst=0, op=dist.ReduceOp.MAX)
        dist.reduce(want, dst=0, op=dist.ReduceOp.MAX, group=gloo)
        if rank == 0:
            close(got, want, f"reduce of {n}")

        out, ref = torch.empty(size * n, device=dev), torch.empty(size * n)
        dist.all_gather_into_tensor(out, x.to(dev))
        dist.all_gather_into_tensor(ref, x, group=gloo)
        close(out, ref, f"all_gather_into_tensor of {n}")

        outs = [torch.empty(n, device=dev) for _ in range(size)]
        dist.all_gather(outs, x.to(dev))
        close(torch.cat(outs), ref, f"all_gather of {n}")

        big = inputs(rank, size * n, seed=1)
        out, ref = torch.empty(n, device=dev), torch.empty(n)
        dist.reduce_scatter_tensor(out, big.to(dev))
        ref_in = big.clone()
        dist.all_reduce(ref_in, group=gloo)
        close(out, ref_in[rank * n:(rank + 1) * n], f"reduce_scatter_tensor of {n}")

    # all_to_all_single with uneven splits: rank r sends r + p + 1 rows to p.
    send_splits = [rank + p + 1 for p in range(size)]
    recv_splits = [p + rank + 1 for p in range(size)]
    x = inputs(rank, sum(send_splits) * 3).view(-1, 3)
    got = torch.empty(sum(recv_splits), 3, device=dev)
    want = torch.empty(sum(recv_splits), 3)
    dist.all_to_all_single(got, x.to(dev), recv_splits, send_splits)
    dist.all_to_all_single(want, x, recv_splits, send_splits, group=gloo)
    close(got, want, "all_to_all_single with splits")

    # A coalesced all-reduce and a non-contiguous tensor (staged, copied back).
    xs = [inputs(rank, n, seed=2) for n in (5, 300, 7000)]
    got = [x.to(dev) for x in xs]
    want = [x.clone() for x in xs]
    dist.all_reduce_coalesced(got)
    dist.all_reduce_coalesced(want, group=gloo)
    for i, (g, w) in enumerate(zip(got, want)):
        close(g, w, f"all_reduce_coalesced tensor {i}")
    base = inputs(rank, 64 * 8).view(64, 8).to(dev)
    column = base[:, 3]  # strided
    want = column.cpu()
    dist.all_reduce(want, group=gloo)
    dist.all_reduce(column)
    close(base[:, 3], want, "all_reduce of a strided view")


def test_point_to_point(rank, size, gloo):
    """send/recv around the ring, and batch_isend_irecv in both directions."""
    import torch
    import torch.distributed as dist

    dev = device_of(rank)
    right = (rank + 1) % size
    mine = torch.full((4096,), float(rank), device=dev)
    got = torch.empty(4096, device=dev)
    left = ring_exchange(mine, got, rank, size)
    close(got, torch.full((4096,), float(left)), "recv from the left")

    from_left, from_right = torch.empty(100, device=dev), torch.empty(100, device=dev)
    ops = [dist.P2POp(dist.isend, mine[:100], right), dist.P2POp(dist.isend, mine[:100], left),
           dist.P2POp(dist.irecv, from_left, left), dist.P2POp(dist.irecv, from_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    close(from_left, torch.full((100,), float(left)), "batch_isend_irecv from the left")
    close(from_right, torch.full((100,), float(right)), "batch_isend_irecv from the right")


def test_streams(rank, size, gloo):
    """The op runs after the work queued before it on the current stream;
    wait() orders the waiting stream after it without blocking the CPU."""
    import torch
    import torch.distributed as dist

    dev = device_of(rank)
    n = 1 << 22
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):
        # Queued work the all-reduce must follow: a long chain of kernels
        # that ends by writing rank + 1 everywhere.
        t = torch.zeros(n, device=dev)
        for _ in range(50):
            t.add_(1.0).mul_(0.5)
        t.fill_(float(rank + 1))
        work = dist.all_reduce(t, async_op=True)
    work.wait()  # the default stream now waits for `side`'s all-reduce
    want = float(size * (size + 1) // 2)
    check(torch.all(t == want).item(), f"all_reduce on a side stream read after wait(): {t[:4]} vs {want}")

    # The future completes with the stream's event: its callback's result
    # follows the op.
    t = torch.full((1000,), float(rank), device=dev)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    want = float(size * (size - 1))
    check(torch.all(fut.wait() == want).item(), "a future's callback ran before its op")


def test_lifetime(rank, size, gloo):
    """A tensor dropped while its op is queued stays alive until the op ran:
    here the input is made on a side stream and used on the current one,
    and the side stream's next allocation would take its memory at once."""
    import torch
    import torch.distributed as dist

    dev = device_of(rank)
    n = 1 << 20
    side = torch.cuda.Stream(device=dev)
    outs = []
    for i in range(20):
        with torch.cuda.stream(side):
            x = torch.full((n,), float(rank + i), device=dev)
        torch.cuda.current_stream(dev).wait_stream(side)
        out = torch.empty(size * n, device=dev)
        dist.all_gather_into_tensor(out, x)
        del x  # only the group still holds it
        with torch.cuda.stream(side):
            torch.full((n,), -1.0, device=dev)
        outs.append(out)
    torch.cuda.synchronize(dev)
    for i, out in enumerate(outs):
        want = torch.cat([torch.full((n,), float(r + i)) for r in range(size)])
        close(out, want, f"all-gather {i} whose input was dropped")


def test_errors(rank, size, gloo):
    """A call with tensors on two devices fails naming them; the group stays usable."""
    import torch
    import torch.distributed as dist

    dev = device_of(rank)
    try:
        dist.all_gather_into_tensor(torch.empty(size * 4), torch.ones(4, device=dev))
    except RuntimeError as error:
        check("cpu" in str(error) and "cuda" in str(error), f"the message names no devices: {error}")
    else:
        raise AssertionError("a call on a CPU and a CUDA tensor was accepted")
    t = torch.ones(8, device=dev)
    dist.all_reduce(t)
    check(torch.all(t == size).item(), "the group after a refused call")


def test_ddp(rank, size, gloo):
    """DDP of a model on the GPU equals DDP of the same model on the CPU
    over Gloo, within float32's rounding of the two devices' kernels."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = device_of(rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    on_gpu = DDP(copy.deepcopy(model).to(dev), device_ids=[dev.index], bucket_cap_mb=1)
    on_cpu = DDP(model, process_group=gloo, bucket_cap_mb=1)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (on_gpu, on_cpu)]
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x, y = torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)
        for m, opt, d in ((on_gpu, opts[0], dev), (on_cpu, opts[1], "cpu")):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x.to(d)), y.to(d)).backward()
            opt.step()
    for (name, a), (_, b) in zip(on_gpu.module.named_parameters(), on_cpu.module.named_parameters()):
        close(a.detach(), b.detach(), f"DDP parameter {name}", bound=1e-4)


def test_all(rank, size, gloo):
    import torch

    torch.cuda.set_device(device_of(rank))
    for test in (test_collectives, test_point_to_point, test_streams, test_lifetime, test_errors, test_ddp):
        test(rank, size, gloo)
        torch.cuda.synchronize()


if __name__ == "__main__":
    if harness._importable() is None:
        import torch

        import braid_torch

        if not braid_torch.HAS_CUDA:
            print("skipped: braid_torch was built without CUDA (its torch is a CPU build, or CMake found no CUDA toolkit)")
            raise SystemExit(harness.SKIP)
        if not torch.cuda.is_available():
            print(f"skipped: torch {torch.__version__} sees no GPU here (torch.cuda.is_available() is False)")
            raise SystemExit(harness.SKIP)
    main(test_all, ranks_from_argv(), timeout_s=120)
    sys.exit(0)
