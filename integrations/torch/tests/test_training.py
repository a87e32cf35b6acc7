"""torch 2's training stacks on backend "braid", each against the same run
on Gloo in the same processes:

- DDP with static_graph, with gradient_as_bucket_view, and with the fp16,
  bf16 and PowerSGD communication hooks;
- FSDP2 (fully_shard) on a 1-D DeviceMesh, and HSDP on a 2-D one (at an
  even number of ranks, 4 or more);
- DTensor redistributions (all-gather, all-to-all, all-reduce and
  reduce-scatter underneath);
- torch.distributed._functional_collectives, eager and under torch.compile;
- a torch.compile'd model under DDP (DDPOptimizer splits its graph at the
  buckets).

Every stack is run twice from the same seeds, once with its groups on
"braid" and once on "gloo". At 2 ranks the results must be equal bit for
bit: every reduction there adds two values, which rounds the same in either
order. At more ranks braid's and Gloo's reduction orders differ, so they
must agree within a bound of the dtype the reductions run in (float32, and
float16 and bfloat16 for the compression hooks): 8 * ranks * its epsilon,
relative and absolute.

    python3 test_training.py NRANKS [STACK ...]
"""
import functools
import sys

from harness import check, main, ranks_from_argv

STEPS = 4


def mlp(seed, widths=(16, 64, 128, 64, 8)):
    import torch

    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def batches(rank, widths=(16, 8), n=STEPS):
    import torch

    data = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(8, widths[0], generator=data), torch.randn(8, widths[1], generator=data)) for _ in range(n)]


def sgd_steps(model, rank, step=None):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches(rank):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step:
            step()


def group_on(backend, gloo):
    import torch.distributed as dist

    return dist.group.WORLD if backend == "braid" else gloo


def full(parameters):
    """Whole parameters: DTensor shards gathered, plain tensors as they are."""
    from torch.distributed.tensor import DTensor

    return [(p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for p in parameters]


# ---- DDP


def ddp(rank, group, bucket_cap_mb=0.01, widths=(16, 64, 128, 64, 8), **options):
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Rank-dependent initial weights: DDP's first broadcast must fix them.
    return DDP(mlp(100 + rank, widths), process_group=group, bucket_cap_mb=bucket_cap_mb, **options)


def ddp_static_graph(rank, size, group, backend):
    model = ddp(rank, group, static_graph=True)
    sgd_steps(model, rank)
    return full(model.parameters())


def ddp_bucket_view(rank, size, group, backend):
    model = ddp(rank, group, gradient_as_bucket_view=True)
    sgd_steps(model, rank)
    return full(model.parameters())


def ddp_fp16_hook(rank, size, group, backend):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = ddp(rank, group)
    model.register_comm_hook(group, default_hooks.fp16_compress_hook)
    sgd_steps(model, rank)
    return full(model.parameters())


def ddp_bf16_hook(rank, size, group, backend):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = ddp(rank, group)
    model.register_comm_hook(group, default_hooks.bf16_compress_hook)
    sgd_steps(model, rank)
    return full(model.parameters())


def ddp_powersgd_hook(rank, size, group, backend):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    # One bucket: the hook issues its P and Q all-reduces from its futures'
    # callbacks, so with several buckets the order in which a rank issues
    # them and the next bucket's all-reduce would depend on thread timing,
    # and the ranks' collectives would not match.
    model = ddp(rank, group, bucket_cap_mb=25)
    # Compression from the second step on (the first is a plain all-reduce),
    # with error feedback and warm start: both all-reduces of P and Q run.
    state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                   min_compression_rate=0.5, random_seed=7)
    model.register_comm_hook(state, powersgd.powerSGD_hook)
    sgd_steps(model, rank)
    return full(model.parameters())


def ddp_compiled(rank, size, group, backend):
    import torch

    # DDPOptimizer wants buckets no smaller than DDP's first (1 MB): 2.1 MB
    # of parameters in 1 MB buckets.
    model = ddp(rank, group, bucket_cap_mb=1, widths=(16, 512, 512, 512, 8))
    # aot_eager: DDPOptimizer's graph split and AOTAutograd, without
    # inductor's C++ code generation (minutes on a small CPU).
    compiled = torch.compile(model, backend="aot_eager")
    sgd_steps(compiled, rank)
    return full(model.parameters())


# ---- FSDP2 and HSDP


def mesh_of(backend, shape, names):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=names,
                            backend_override={name: backend for name in names})


def sharded(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def fsdp2(rank, size, group, backend):
    model = sharded(mlp(5), mesh_of(backend, (size,), ("shard",)))
    sgd_steps(model, rank)
    return full(model.parameters())


def hsdp(rank, size, group, backend):
    if size < 4 or size % 2:
        return None
    model = sharded(mlp(6), mesh_of(backend, (size // 2, 2), ("replicate", "shard")))
    sgd_steps(model, rank)
    return full(model.parameters())


# ---- DTensor and functional collectives


def dtensor_redistribute(rank, size, group, backend):
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = mesh_of(backend, (size,), ("dp",))
    whole = torch.randn(4 * size + 1, 2 * size + 3, generator=torch.Generator().manual_seed(3))  # uneven shards
    rows = distribute_tensor(whole, mesh, [Shard(0)])
    out = [rows.redistribute(mesh, [Replicate()]).to_local(),  # all-gather
           rows.redistribute(mesh, [Shard(1)]).to_local()]  # all-to-all
    mine = torch.randn(5, 7, generator=torch.Generator().manual_seed(40 + rank))
    partial = DTensor.from_local(mine, mesh, [Partial()])
    out.append(partial.redistribute(mesh, [Replicate()]).to_local())  # all-reduce
    out.append(partial.redistribute(mesh, [Shard(0)]).to_local())  # reduce-scatter
    out.append(partial.redistribute(mesh, [Replicate()]).full_tensor())
    check(torch.equal(out[0], whole), "Shard(0) to Replicate() did not give back the whole tensor")
    return out


def functional(rank, size, group, backend):
    import torch
    import torch.distributed._functional_collectives as funcol

    x = torch.randn(size * 6, 3, generator=torch.Generator().manual_seed(50 + rank))

    def calls(t):
        return [funcol.all_reduce(t, "sum", group),
                funcol.all_reduce(t, "max", group),
                funcol.all_gather_tensor(t, 0, group),
                funcol.reduce_scatter_tensor(t, "sum", 0, group),
                funcol.all_to_all_single(t, None, None, group),
                funcol.broadcast(t, size - 1, group)]

    eager = [funcol.wait_tensor(t) for t in calls(x)]
    compiled = torch.compile(lambda t: [y * 1 for y in calls(t)], backend="aot_eager", fullgraph=True)(x)
    for i, (a, b) in enumerate(zip(eager, compiled)):
        check(torch.equal(a, b), f"functional collective {i}: compiled and eager differ")
    return eager


STACKS = {f.__name__: f for f in (ddp_static_graph, ddp_bucket_view, ddp_fp16_hook, ddp_bf16_hook,
                                  ddp_powersgd_hook, ddp_compiled, fsdp2, hsdp, dtensor_redistribute,
                                  functional)}
# The dtype the reductions run in, where it is not the results' own.
REDUCED_IN = {"ddp_fp16_hook": "float16", "ddp_bf16_hook": "bfloat16"}


def tolerance(dtype, size):
    """(rtol, atol) for results of reductions in `dtype` in different orders."""
    import torch

    eps = torch.finfo(dtype).eps
    return 8 * size * eps, 8 * size * eps


def compare(name, ours, theirs, size):
    import torch

    reduced_in = getattr(torch, REDUCED_IN[name]) if name in REDUCED_IN else None

    """The largest difference from Gloo's results, 0.0 if they are equal."""
    check(len(ours) == len(theirs), f"{name}: {len(ours)} results, Gloo's run gave {len(theirs)}")
    largest = 0.0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        check(a.shape == b.shape and a.dtype == b.dtype, f"{name}: result {i} is {a.shape} {a.dtype}, Gloo's {b.shape} {b.dtype}")
        d = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        if size == 2:
            check(torch.equal(a, b), f"{name}: result {i} differs from Gloo's (max |d| = {d})")
        else:
            rtol, atol = tolerance(reduced_in or a.dtype, size)
            check(torch.allclose(a, b, rtol=rtol, atol=atol), f"{name}: result {i} differs from Gloo's (max |d| = {d})")
        largest = max(largest, d)
    return largest


def test_training(rank, size, gloo, names):
    import torch
    import torch.distributed as dist

    for name in names:
        stack = STACKS[name]
        ours = stack(rank, size, group_on("braid", gloo), "braid")
        if ours is None:
            if rank == 0:
                print(f"{name}: needs an even number of ranks, 4 or more")
            continue
        theirs = stack(rank, size, group_on("gloo", gloo), "gloo")
        largest = compare(name, ours, theirs, size)
        # Every rank holds the same model.
        if name.startswith("ddp") or name in ("fsdp2", "hsdp"):
            flat = torch.cat([t.reshape(-1).double() for t in ours])
            everyone = [torch.empty_like(flat) for _ in range(size)]
            dist.all_gather(everyone, flat)
            check(all(torch.equal(everyone[0], e) for e in everyone), f"{name}: ranks disagree")
        if rank == 0:
            print(f"{name}: equal to Gloo's" if largest == 0 else f"{name}: within bounds of Gloo's (max |d| = {largest:.3g})")


if __name__ == "__main__":
    nranks = ranks_from_argv()
    names = sys.argv[2:] or list(STACKS)
    unknown = [n for n in names if n not in STACKS]
    if unknown:
        raise SystemExit(f"unknown stacks {unknown}; known: {', '.join(STACKS)}")
    main(functools.partial(test_training, names=names), nranks, timeout_s=300)
