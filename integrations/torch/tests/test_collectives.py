"""Every process-group call on backend "braid", against the same call on Gloo
with the same inputs: integers exactly, floats within the dtype's bound.
Where Gloo does not take a dtype or op, against a reference computed from
every rank's inputs (each rank can make any rank's inputs).

    /usr/bin/python3 test_collectives.py NRANKS
"""
import functools
import time
import warnings

warnings.filterwarnings("ignore", message=".*private function.*")

from harness import check, main, ranks_from_argv, ring_exchange

INTS = ["int8", "uint8", "int32", "int64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]


def dtype_of(name):
    import torch

    return getattr(torch, name)


def tolerance(dtype, nranks):
    import torch

    # Each rank's value is rounded once per partial sum; sums of 3+ ranks
    # may be added in another order than Gloo adds them.
    eps = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1.2e-7, torch.float64: 2.3e-16}
    return 4 * nranks * eps.get(dtype, 0.0)


def values(rank, n, dtype, seed):
    """Rank `rank`'s input: small values, so sums and products stay exact
    in every integer type."""
    import torch

    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, (n,), generator=g, dtype=torch.int64).to(dtype)


def same(got, want, dtype, nranks, what):
    import torch

    check(got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}")
    if dtype.is_floating_point:
        bound = tolerance(dtype, nranks)
        close = torch.allclose(got.double(), want.double(), rtol=bound, atol=bound)
        check(close, f"{what}: differs beyond {bound}: {got[:6]} vs {want[:6]}")
    else:
        check(torch.equal(got, want), f"{what}: {got[:8]} vs {want[:8]}")


def on_gloo(call, reference):
    """Gloo's result of `call`, or the reference where Gloo refuses."""
    try:
        return call()
    except RuntimeError as error:
        text = str(error).lower()
        if "gloo" in text or "unsupported" in text or "not supported" in text or "cannot use" in text or "invalid scalar type" in text:
            return reference()
        raise


def op_name(op):
    import torch.distributed as dist

    names = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
    return next((n for n in names if getattr(dist.ReduceOp, n) == op), str(op))


def reduce_reference(inputs, op, dtype):
    import torch
    import torch.distributed as dist

    stacked = torch.stack([x.double() if dtype.is_floating_point else x.long() for x in inputs])
    if op == dist.ReduceOp.SUM:
        out = stacked.sum(0) if dtype != torch.bool else stacked.amax(0)
    elif op == dist.ReduceOp.PRODUCT:
        out = stacked.prod(0) if dtype != torch.bool else stacked.amin(0)
    elif op == dist.ReduceOp.MIN:
        out = stacked.amin(0)
    elif op == dist.ReduceOp.MAX:
        out = stacked.amax(0)
    elif op == dist.ReduceOp.BAND:
        out = stacked.amin(0)
    elif op == dist.ReduceOp.BOR:
        out = stacked.amax(0)
    elif op == dist.ReduceOp.AVG:
        out = stacked.sum(0) / len(inputs)
    else:
        raise ValueError(op)
    return out.to(dtype)


def test_reductions(rank, size, gloo):
    import torch
    import torch.distributed as dist

    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    seed = 0
    for name in INTS + FLOATS + ["bool"]:
        dtype = dtype_of(name)
        extra = [dist.ReduceOp.BAND, dist.ReduceOp.BOR] if dtype == torch.bool else []
        extra += [dist.ReduceOp.AVG] if dtype.is_floating_point else []
        for op in ops + extra:
            for n in (0, 1, 7, 1000, 70001):
                seed += 1
                inputs = [values(r, n, dtype, seed) for r in range(size)]
                mine = inputs[rank]
                what = f"{name} {op_name(op)} n={n}"
                ref = functools.partial(reduce_reference, inputs, op, dtype)
                gloo_op = dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op

                # all_reduce, in place; a strided (non-contiguous) view too
                t = mine.clone()
                dist.all_reduce(t, op=op)
                def gloo_all_reduce():
                    g = mine.clone()
                    dist.all_reduce(g, op=gloo_op, group=gloo)
                    return g if op != dist.ReduceOp.AVG else (g.double() / size).to(dtype)
                same(t, on_gloo(gloo_all_reduce, ref), dtype, size, "all_reduce " + what)
                if n == 1000:
                    wide = torch.zeros(n, 2, dtype=dtype)
                    wide[:, 1] = mine
                    view = wide[:, 1]
                    dist.all_reduce(view, op=op)
                    same(wide[:, 1], t, dtype, size, "all_reduce of a strided view " + what)

                # reduce to a root
                root = seed % size
                t = mine.clone()
                dist.reduce(t, dst=root, op=op)
                if rank == root:
                    same(t, ref(), dtype, size, f"reduce to {root} " + what)

                # reduce_scatter (a list) and _reduce_scatter_base (one tensor)
                if n in (7, 1000):
                    chunks = [values(r, size * n, dtype, seed + 7) for r in range(size)]
                    whole = reduce_reference(chunks, op, dtype)
                    out = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter(out, list(chunks[rank].chunk(size)), op=op)
                    same(out, whole[rank * n:(rank + 1) * n], dtype, size, "reduce_scatter " + what)
                    out2 = torch.empty(n, dtype=dtype)
                    dist._reduce_scatter_base(out2, chunks[rank].clone(), op=op)
                    same(out2, out, dtype, size, "_reduce_scatter_base " + what)


def test_premul_sum(rank, size, gloo):
    import torch
    import torch.distributed as dist

    for name in FLOATS:
        dtype = dtype_of(name)
        inputs = [values(r, 501, dtype, 77) for r in range(size)]
        # The factor as a number, and as a tensor.
        tensor = torch.tensor([0.25], dtype=torch.float64)
        for factor in (0.5, tensor):
            t = inputs[rank].clone()
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
            scale = factor if isinstance(factor, float) else tensor.item()
            scaled = [(x.double() * scale).to(dtype) for x in inputs]

            def gloo_sum():
                g = scaled[rank].clone()
                dist.all_reduce(g, group=gloo)
                return g

            want = on_gloo(gloo_sum, lambda: reduce_reference(scaled, dist.ReduceOp.SUM, dtype))
            same(t, want, dtype, size, f"PREMUL_SUM {name} by {scale}")


def test_coalesced(rank, size, gloo):
    import torch
    import torch.distributed as dist

    tensors = [values(rank, n, torch.float32, n) for n in (3, 1000, 0, 65)]
    expected = [t.clone() for t in tensors]
    for t in expected:
        dist.all_reduce(t, group=gloo)
    dist.all_reduce_coalesced(tensors)
    for i, (t, e) in enumerate(zip(tensors, expected)):
        same(t, e, torch.float32, size, f"all_reduce_coalesced tensor {i}")


def test_coalescing(rank, size, gloo):
    """batch_isend_irecv, the coalescing manager and the *_coalesced
    gathers, each against Gloo or the plain call."""
    import torch
    import torch.distributed as dist

    # Around the ring both ways, the receives posted first, 2^18 floats each
    # way: more than the connections' slots hold, so it finishes only if
    # the batch runs as one group.
    n = (1 << 18) + 3
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    mine = values(rank, n, torch.float32, 61)
    from_prev, from_next = torch.empty(n), torch.empty(n)
    ops = [dist.P2POp(dist.irecv, from_prev, prev), dist.P2POp(dist.irecv, from_next, nxt),
           dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.isend, mine, prev)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    same(from_prev, values(prev, n, torch.float32, 61), torch.float32, size, "batch_isend_irecv from the previous rank")
    same(from_next, values(nxt, n, torch.float32, 61), torch.float32, size, "batch_isend_irecv from the next rank")

    # all_gather_into_tensor and reduce_scatter_tensor, coalesced (FSDP2's calls).
    sizes = (5, 4099, 0, 70001)
    ins = [values(rank, k, torch.float32, 62 + k) for k in sizes]
    outs = [torch.empty(size * k) for k in sizes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for out, inp in zip(outs, ins):
            dist.all_gather_into_tensor(out, inp)
    cm.wait()
    for k, out in zip(sizes, outs):
        want = torch.cat([values(r, k, torch.float32, 62 + k) for r in range(size)])
        same(out, want, torch.float32, size, f"coalesced all_gather_into_tensor of {k}")
    wholes = [values(rank, size * k, torch.float32, 63 + k) for k in sizes]
    parts = [torch.empty(k) for k in sizes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for part, whole in zip(parts, wholes):
            dist.reduce_scatter_tensor(part, whole)
    cm.wait()
    for k, whole, part in zip(sizes, wholes, parts):
        want = torch.empty(k)
        if k:
            dist.reduce_scatter_tensor(want, whole.clone(), group=gloo)
        same(part, want, torch.float32, size, f"coalesced reduce_scatter_tensor of {k}")

    # A coalesced call inside a batch the caller opened (as the coalescing
    # manager with a device does): its Work completes with the batch.
    world = dist.group.WORLD
    cpu = torch.device("cpu")
    outs = [torch.empty(size * k) for k in sizes]
    world._start_coalescing(cpu)
    inner = world.allgather_into_tensor_coalesced(outs, ins)
    world._end_coalescing(cpu).wait()
    inner.wait()
    check(inner.is_completed(), "the coalesced call inside a batch did not complete with it")
    for k, out in zip(sizes, outs):
        want = torch.cat([values(r, k, torch.float32, 62 + k) for r in range(size)])
        same(out, want, torch.float32, size, f"all_gather_into_tensor coalesced inside a batch, {k}")

    # Sequence numbers: every collective counts, point-to-point calls not.
    before = world._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(3))
    if rank % 2 == 0:
        dist.send(torch.ones(1), nxt)
        dist.recv(torch.ones(1), prev)
    else:
        dist.recv(torch.ones(1), prev)
        dist.send(torch.ones(1), nxt)
    dist.barrier()
    after = world._get_sequence_number_for_group()
    check(after == before + 2, f"the sequence number went from {before} to {after}, not up by 2")
    numbers = [None] * size
    dist.all_gather_object(numbers, after, group=gloo)
    check(len(set(numbers)) == 1, f"the ranks' sequence numbers differ: {numbers}")

    # all_gather_coalesced: one list per rank, of one output per input
    # (lists[r][i] is rank r's input i), as Gloo takes it.
    lists = [[torch.empty(k) for k in sizes] for _ in range(size)]
    dist.all_gather_coalesced(lists, ins)
    theirs = [[torch.empty(k) for k in sizes] for _ in range(size)]
    dist.all_gather_coalesced(theirs, ins, group=gloo)
    for r in range(size):
        for i, k in enumerate(sizes):
            want = values(r, k, torch.float32, 62 + k)
            same(theirs[r][i], want, torch.float32, size, f"Gloo's all_gather_coalesced of {k} from rank {r}")
            same(lists[r][i], want, torch.float32, size, f"all_gather_coalesced of {k} from rank {r}")


def test_data_movement(rank, size, gloo):
    import torch
    import torch.distributed as dist

    seed = 500
    for name in INTS + FLOATS + ["bool"]:
        dtype = dtype_of(name)
        for n in (0, 1, 7, 4099):
            seed += 1
            inputs = [values(r, n, dtype, seed) for r in range(size)]
            mine = inputs[rank]
            what = f"{name} n={n}"
            for root in range(size):
                t = mine.clone()
                dist.broadcast(t, src=root)
                same(t, inputs[root], dtype, size, f"broadcast from {root} " + what)

            outs = [torch.empty(n, dtype=dtype) for _ in range(size)]
            dist.all_gather(outs, mine)
            def gloo_all_gather():
                g = [torch.empty(n, dtype=dtype) for _ in range(size)]
                dist.all_gather(g, mine, group=gloo)
                return g

            if n > 0:  # Gloo's all_gather of empty tensors dies of SIGFPE
                g = on_gloo(gloo_all_gather, lambda: inputs)
                for r in range(size):
                    same(outs[r], g[r], dtype, size, f"all_gather part {r} " + what)
            for r in range(size):
                same(outs[r], inputs[r], dtype, size, f"all_gather part {r} vs input " + what)
            flat = torch.empty(size * n, dtype=dtype)
            dist._all_gather_base(flat, mine)
            same(flat, torch.cat(inputs), dtype, size, "_all_gather_base " + what)

            root = seed % size
            gathered = [torch.empty(n, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(mine, gather_list=gathered, dst=root)
            if rank == root:
                for r in range(size):
                    same(gathered[r], inputs[r], dtype, size, f"gather to {root} part {r} " + what)
            into = torch.full((size * n,), 7, dtype=dtype) if rank == root else None
            dist.gather_into_tensor(mine, into, dst=root)
            if rank == root:
                same(into, torch.cat(inputs), dtype, size, f"gather_into_tensor to {root} " + what)

            pieces = [values(r + 100, n, dtype, seed) for r in range(size)]
            out = torch.empty(n, dtype=dtype)
            dist.scatter(out, scatter_list=pieces if rank == root else None, src=root)
            same(out, pieces[rank], dtype, size, f"scatter from {root} " + what)


def test_all_to_all(rank, size, gloo):
    import torch
    import torch.distributed as dist

    # Equal splits, rows of 3 elements.
    rows = 2 * size
    x = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + 100 * rank
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    g = torch.empty_like(x)
    dist.all_to_all_single(g, x, group=gloo)
    same(out, g, torch.float32, size, "all_to_all_single, equal splits")

    # Uneven splits: rank r sends (r + p) % 3 rows to rank p.
    def rows_to(src, dst):
        return (src + dst) % 3

    send_splits = [rows_to(rank, p) for p in range(size)]
    recv_splits = [rows_to(p, rank) for p in range(size)]
    x = torch.randn(sum(send_splits), 5, generator=torch.Generator().manual_seed(rank))
    out = torch.empty(sum(recv_splits), 5)
    dist.all_to_all_single(out, x, output_split_sizes=recv_splits, input_split_sizes=send_splits)
    g = torch.empty_like(out)
    dist.all_to_all_single(g, x, output_split_sizes=recv_splits, input_split_sizes=send_splits, group=gloo)
    same(out, g, torch.float32, size, "all_to_all_single, uneven splits")

    # A list of tensors, int64, one of another length per peer.
    ins = [torch.full((p + 1 + rank,), rank * 10 + p, dtype=torch.int64) for p in range(size)]
    outs = [torch.empty(rank + 1 + p, dtype=torch.int64) for p in range(size)]
    dist.all_to_all(outs, ins)
    for p in range(size):
        same(outs[p], torch.full((rank + 1 + p,), p * 10 + rank, dtype=torch.int64), torch.int64, size, f"all_to_all from {p}")


def test_point_to_point(rank, size, gloo):
    import torch
    import torch.distributed as dist

    # A ring, both directions, blocking and not.
    right, left = (rank + 1) % size, (rank - 1) % size
    for n in (0, 1, 100_000):
        out = torch.arange(n, dtype=torch.float64) + rank
        got = torch.empty(n, dtype=torch.float64)
        ring_exchange(out, got, rank, size)
        same(got, torch.arange(n, dtype=torch.float64) + left, torch.float64, size, f"send/recv n={n}")
        got2 = torch.empty(n, dtype=torch.float64)
        works = [dist.isend(out, left), dist.irecv(got2, right)]
        for w in works:
            w.wait()
        same(got2, torch.arange(n, dtype=torch.float64) + right, torch.float64, size, f"isend/irecv n={n}")
    # A strided receive buffer.
    wide = torch.zeros(10, 2)
    if rank == 0:
        dist.send(torch.arange(10.0), 1)
    elif rank == 1:
        dist.recv(wide[:, 0], 0)
        same(wide[:, 0], torch.arange(10.0), torch.float32, size, "recv into a strided view")
    dist.barrier()
    # From any source: every other rank sends rank 0 two tensors, which
    # learns each sender from dist.recv (blocking) or from irecv's work;
    # each sender's two arrive in its order.
    if rank == 0:
        got = {src: [] for src in range(1, size)}
        for k in range(2 * (size - 1)):
            t = torch.empty(3)
            if k % 2:
                src = dist.recv(t)
            else:
                work = dist.irecv(t)
                work.wait()
                src = work._source_rank()
            check(src in got, f"recv from any source named rank {src}")
            got[src].append(t)
        for src, tensors in got.items():
            check(len(tensors) == 2, f"{len(tensors)} tensors from rank {src}")
            for m, t in enumerate(tensors):
                same(t, torch.full((3,), src * 10.0 + m), torch.float32, size, f"message {m} of rank {src}")
    else:
        for m in range(2):
            dist.send(torch.full((3,), rank * 10.0 + m), 0)
    dist.barrier()


def test_futures(rank, size, gloo):
    import torch
    import torch.distributed as dist

    # Futures complete without wait(), with the tensors, and run their
    # callbacks once each.
    tensors = [torch.full((1000,), float(i + rank)) for i in range(20)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futures = [w.get_future() for w in works]
    ran = []
    for i, f in enumerate(futures):
        f.then(lambda fut, i=i: ran.append(i))
    torch.futures.wait_all(futures)
    for i, t in enumerate(tensors):
        want = sum(float(i + r) for r in range(size))
        check(bool((t == want).all()), f"async all_reduce {i}: {t[0]} vs {want}")
        check(works[i].is_completed() and works[i].is_success(), f"work {i} not completed")
        check(torch.equal(futures[i].value()[0], t), f"future {i}'s value is not the tensor")
    deadline = time.monotonic() + 10
    while len(ran) < 20 and time.monotonic() < deadline:  # (the last callbacks may still run)
        time.sleep(0.001)
    check(sorted(ran) == list(range(20)), f"the callbacks that ran: {sorted(ran)}")

    # After blocking calls (each run by the thread that waits for it), a call
    # that nobody waits for still runs: here the ranks only poll its future.
    for _ in range(50):
        dist.all_reduce(torch.ones(8))
    polled = torch.ones(8)
    future = dist.all_reduce(polled, async_op=True).get_future()
    deadline = time.monotonic() + 10
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    check(future.done(), "an async all_reduce that nobody waits for did not complete in 10 s")
    same(polled, torch.full((8,), float(size)), torch.float32, size, "the polled all_reduce")

    # A future's callback may make a blocking call of its own (the thread
    # that completes the future runs it too).
    inner = []

    def chained(fut):
        u = torch.ones(4)
        dist.all_reduce(u)
        inner.append(u)
        return fut.value()

    chain = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(chained)
    chain.wait()
    check(len(inner) == 1 and bool((inner[0] == size).all()), f"the callback's all_reduce gave {inner}")

    # ... or issue one asynchronously and wait for its future, as PowerSGD's
    # hook does; each stage of the chain on the result of the one before.
    def stage(fut):
        return dist.all_reduce(fut.value()[0] * 2, async_op=True).get_future().wait()

    chain = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(stage).then(stage)
    got = chain.wait()[0]
    want = float(size * (2 * size) * (2 * size))
    check(bool((got == want).all()), f"the chained async all_reduces gave {got}, not {want}")
    check(dist.get_backend() == "braid", dist.get_backend())


def test_new_group(rank, size, gloo):
    import torch
    import torch.distributed as dist

    # A group of the first two ranks and one of the others (when there are
    # others): each has a communicator of its own, numbered from 0.
    first = dist.new_group([0, 1])
    rest = dist.new_group(list(range(2, size))) if size > 2 else None
    t = torch.full((5,), float(rank))
    if rank < 2:
        dist.all_reduce(t, group=first)
        same(t, torch.full((5,), 1.0), torch.float32, 2, "all_reduce in the group of ranks 0 and 1")
        check(dist.get_rank(first) == rank and dist.get_backend(first) == "braid", "the new group's rank or backend")
    elif rest is not None:
        dist.all_reduce(t, group=rest)
        same(t, torch.full((5,), float(sum(range(2, size)))), torch.float32, size, "all_reduce in the other group")
    dist.all_reduce(torch.ones(1))  # the world group still works after


def test_split_group(rank, size, gloo):
    """split_group on braid's split: disjoint groups in the order given, and
    a rank left out of every group."""
    import torch
    import torch.distributed as dist

    # Two groups, each in reverse rank order: its first rank is its rank 0.
    halves = [list(range(size // 2))[::-1], list(range(size // 2, size))[::-1]]
    halves = [h for h in halves if h]
    mine = next(h for h in halves if rank in h)
    group = dist.split_group(split_ranks=halves)
    check(dist.get_rank(group) == mine.index(rank), f"rank {rank} is {dist.get_rank(group)} in {mine}")
    check(dist.get_world_size(group) == len(mine), f"the group of {mine} has {dist.get_world_size(group)} ranks")
    t = torch.full((1000,), float(rank))
    dist.all_reduce(t, group=group)
    same(t, torch.full((1000,), float(sum(mine))), torch.float32, size, f"all_reduce in the split group {mine}")
    t = torch.full((3,), float(rank))
    dist.broadcast(t, group_src=0, group=group)  # from the group's rank 0: its first rank
    same(t, torch.full((3,), float(mine[0])), torch.float32, size, f"broadcast from {mine[0]} in {mine}")

    # Only ranks 0 and 1: the others are in no group.
    pair = dist.split_group(split_ranks=[[0, 1]])
    if rank < 2:
        t = torch.ones(5)
        dist.all_reduce(t, group=pair)
        same(t, torch.full((5,), 2.0), torch.float32, 2, "all_reduce in the split pair")
    else:
        check(pair is dist.GroupMember.NON_GROUP_MEMBER, f"rank {rank} outside the split got {pair}")
    dist.all_reduce(torch.ones(1))  # the parent group still works after


def test_all(rank, size, gloo):
    for test in (test_reductions, test_premul_sum, test_coalesced, test_coalescing, test_data_movement,
                 test_all_to_all, test_point_to_point, test_futures, test_new_group, test_split_group):
        test(rank, size, gloo)


if __name__ == "__main__":
    main(test_all, ranks_from_argv(), timeout_s=120)
