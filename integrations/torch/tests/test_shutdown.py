"""abort and shutdown of a "braid" group never hang.

- _abort_process_group() fails a call that waits for a rank that is not
  there yet, at once, with braid's "aborted"; destroy_process_group() then
  returns at once (aborting the default group destroys it already), and
  so does the late rank's, whose call fails naming the aborted rank.
- destroy_process_group() after calls still running lets them finish.

    python3 test_shutdown.py
"""
import time

from harness import check, main


def test_abort(rank, size, gloo):
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _abort_process_group

    t = torch.ones(1 << 16)
    if rank == 1:
        time.sleep(2.0)  # late: rank 0 aborts while its call waits for this one
        start = time.monotonic()
        try:
            dist.all_reduce(t)
            raise AssertionError("the all_reduce completed on an aborted group")
        except RuntimeError as error:
            check("peer 0" in str(error) or "rank 0" in str(error), f"the late rank's error does not name rank 0: {error}")
        check(time.monotonic() - start < 5.0, "the late rank's call took past the timeout")
    else:
        work = dist.all_reduce(t, async_op=True)
        time.sleep(0.3)
        aborted = time.monotonic()
        _abort_process_group()
        try:
            work.wait()
            raise AssertionError("the all_reduce completed after abort")
        except RuntimeError as error:
            check("aborted" in str(error), f"the error does not say aborted: {error}")
        took = time.monotonic() - aborted
        check(took < 1.0, f"the call failed {took:.2f} s after the abort")
    start = time.monotonic()
    if dist.is_initialized():  # (aborting the default group also destroyed it)
        dist.destroy_process_group()
    check(time.monotonic() - start < 2.0, "destroy_process_group took over 2 s after the abort")


def test_shutdown(rank, size, gloo):
    import torch
    import torch.distributed as dist

    works = [dist.all_reduce(torch.full((4099,), float(i)), async_op=True) for i in range(20)]
    dist.destroy_process_group()  # shuts the group down: the calls finish first
    for work in works:
        check(work.is_completed(), "a call was left unfinished by destroy_process_group")


if __name__ == "__main__":
    main(test_abort, 2, timeout_s=10, finish=False)
    main(test_shutdown, 2, finish=False)
