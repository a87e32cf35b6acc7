"""Bad calls on backend "braid" raise a Python exception carrying braid's
message (rank, call, what is wrong), and the group stays usable after each.

    /usr/bin/python3 test_errors.py NRANKS
"""
from harness import check, main, ranks_from_argv


def raises(call, *needles):
    try:
        call()
    except RuntimeError as error:
        text = str(error)
        for needle in needles:
            check(needle in text, f"the error does not say {needle!r}: {text}")
        return text
    raise AssertionError(f"no error; expected one saying {needles}")


def still_usable(rank, size, what):
    import torch
    import torch.distributed as dist

    t = torch.ones(5)
    dist.all_reduce(t)
    check(bool((t == size).all()), f"after {what}: all_reduce gave {t}")


def test_errors(rank, size, gloo):
    import torch
    import torch.distributed as dist

    me = f"braid rank {rank}"
    # Shapes that do not match.
    outs = [torch.empty(4) for _ in range(size)]
    outs[-1] = torch.empty(5)
    raises(lambda: dist.all_gather(outs, torch.ones(4)), me, "allgather", f"output tensor {size - 1}", "5 elements, not 4")
    still_usable(rank, size, "a mismatched all_gather")
    raises(lambda: dist.all_gather([torch.empty(4)] * (size + 1), torch.ones(4)), "not one per rank")
    raises(lambda: dist._all_gather_base(torch.empty(3 * size + 1), torch.ones(3)), "_allgather_base", "times the input")
    raises(lambda: dist.reduce_scatter(torch.empty(3), [torch.ones(3)] * (size - 1) + [torch.ones(2)]), "reduce_scatter", f"input tensor {size - 1} has 2 elements, not 3")
    raises(lambda: dist.all_to_all_single(torch.empty(2 * size + 1), torch.ones(2 * size + 1)), "alltoall_base", f"split into {size} equal parts")
    raises(lambda: dist.all_to_all_single(torch.empty(size), torch.ones(size), [1] * size, [2] * size), "split sizes add up to")
    still_usable(rank, size, "mismatched shapes")

    # A CUDA tensor, where this torch has CUDA. (Without it no other device
    # reaches a backend: torch's dispatcher refuses a meta tensor itself.)
    if torch.cuda.is_available():
        raises(lambda: dist.all_reduce(torch.ones(4, device="cuda")), me, "allreduce", "is on cuda", "CPU tensors")
        still_usable(rank, size, "a CUDA tensor")
    elif rank == 0:
        print("the CUDA tensor case is skipped: this torch has no CUDA")

    # Ops and dtypes braid does not have.
    raises(lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BXOR), "ReduceOp.BXOR", "Float")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND), "ReduceOp.BAND", "Int")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)), "PREMUL_SUM")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), "dtype Short", "does not carry")
    # (Complex tensors reach the backend as float pairs: torch views them so.)
    z = torch.full((4,), complex(1, rank))
    dist.all_reduce(z)
    check(bool((z == complex(size, sum(range(size)))).all()), f"complex all_reduce gave {z}")
    still_usable(rank, size, "unsupported ops and dtypes")

    # Ranks that are not in the group.
    raises(lambda: dist.broadcast(torch.ones(3), src=size), "is not a rank of this group")
    # (torch refuses a send to itself before the backend sees it: ask the backend.)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    raises(lambda: backend.send([torch.ones(3)], rank, 0), "cannot send to itself")
    raises(lambda: backend.recv_anysource([torch.ones(0)], 0), "recv from any source", "is empty")
    still_usable(rank, size, "bad ranks")
    check(dist.get_backend() == "braid", dist.get_backend())

    # monitored_barrier: all come; then the odd ranks stay away, and rank 0
    # names them (all of them, or the first), the others time out waiting
    # for rank 0's release.
    from datetime import timedelta

    dist.monitored_barrier(timeout=timedelta(seconds=30))
    odd = [r for r in range(1, size, 2)]
    for wait_all in (True, False):
        if rank in odd:
            break
        if rank == 0:
            named = odd if wait_all else odd[:1]
            text = ("Ranks " if len(named) > 1 else "Rank ") + ", ".join(map(str, named))
            needles = ("braid rank 0", f"{text} failed to pass monitoredBarrier in 1000 ms")
        else:
            needles = (me, f"Rank {rank} successfully reached monitoredBarrier", "from rank 0",
                       "did not release the barrier within 1000 ms")
        raises(lambda: dist.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=wait_all), *needles)
    still_usable(rank, size, "a monitored_barrier that ranks stayed away from")

    # A group's own timeout: rank 0 waits in a group whose timeout is 2 s
    # for a rank that never comes, and fails by it, not by the world's;
    # the same for a group made with 60 s and set to 2 s (dist.set_timeout).
    import time

    def times_out_in_2_s(group, what):
        if rank == 0:
            start = time.monotonic()
            raises(lambda: dist.all_reduce(torch.ones(3), group=group), me, "allReduce",
                   "(the timeout is 2000 ms)")
            took = time.monotonic() - start
            check(1.5 < took < 10, f"{what} timed out after {took:.1f} s")
        dist.barrier()
        still_usable(rank, size, what)

    times_out_in_2_s(dist.new_group(timeout=timedelta(seconds=2)), "a group made with a 2 s timeout")
    longer = dist.new_group(timeout=timedelta(seconds=60))
    dist.set_timeout(timedelta(seconds=2), group=longer)
    times_out_in_2_s(longer, "a group set to a 2 s timeout")


if __name__ == "__main__":
    main(test_errors, ranks_from_argv())
