"""torchft over braid: its Manager reconfigures braid_torch.torchft's group
through shrink and grow, with torchft's own lighthouse (the program its
wheel installs, started and stopped here).

Four replicas of one process each sum a tensor every step. Replica 1
kills itself (SIGKILL) in a step, after its quorum; the others' sum fails,
the lighthouse gives them a quorum of three, and their group shrinks. Then a
new process, replica 4, starts: the quorum of four makes the three grow
the group, replica 4 joins it, recovers the step from a peer, and all four
go on. Every committed step's sum is checked against the quorum's size.

    python3 test_torchft.py
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import harness

VICTIM = 1
NEWCOMER = 4
STEPS_BEFORE_KILL = 3
STEPS_AT_THREE = 3  # committed at three before the newcomer starts
STEPS_AT_FOUR = 3  # committed by every replica after the grow


def replica_main(index, lighthouse, ready, committed_at_three, results):
    import datetime

    import torch
    from torch.distributed import ReduceOp, TCPStore
    from torchft import Manager

    from braid_torch.torchft import ProcessGroupBraid

    torch.set_num_threads(1)
    log = []
    try:
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        state = {"step": 0}
        pg = ProcessGroupBraid(timeout=datetime.timedelta(seconds=10))
        manager = Manager(
            pg=pg,
            min_replica_size=3,
            load_state_dict=lambda s: state.update(s),
            state_dict=lambda: dict(state),
            use_async_quorum=False,
            store_addr="127.0.0.1",
            store_port=store.port,
            rank=0,
            world_size=1,
            lighthouse_addr=lighthouse,
            replica_id=f"replica_{index}",
            timeout=datetime.timedelta(seconds=10),
            quorum_timeout=datetime.timedelta(seconds=30),
        )
        # The first four meet before their first quorum, so that it has all
        # of them (a replica heartbeats from here on).
        ready[index] = True
        while index != NEWCOMER and len(ready) < 4:
            time.sleep(0.01)
        grown_commits = 0
        timings = []  # each reconfiguring quorum: the way taken, start_quorum's time
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            time.sleep(0.02)  # a step's work, so that the new replica has steps to meet
            before = dict(pg.reconfigurations)
            started = time.monotonic()
            manager.start_quorum()
            if dict(pg.reconfigurations) != before:  # this quorum reconfigured the group
                way = next(w for w, n in pg.reconfigurations.items() if n != before.get(w, 0))
                timings.append(f"{way} {time.monotonic() - started:.3f} s")
            if index == VICTIM and state["step"] == STEPS_BEFORE_KILL:
                os.kill(os.getpid(), signal.SIGKILL)  # in the step: the others' sum fails
            t = torch.ones(1000)
            manager.allreduce(t, reduce_op=ReduceOp.SUM).wait()
            size = manager.num_participants()
            if not manager.should_commit():
                log.append(("failed", size))
                continue
            state["step"] += 1
            assert bool((t == size).all()), f"the sum at {size} replicas is {t[:4]}"
            log.append(("committed", size))
            ways = pg.reconfigurations
            if size == 3:
                committed_at_three[index] = committed_at_three.get(index, 0) + 1
            if size == 4 and (ways["grow"] or ways["shrink+grow"] or ways["join"]):
                grown_commits += 1
                if grown_commits == STEPS_AT_FOUR:
                    break
        else:
            raise AssertionError("no steps at four replicas after the grow within 90 s")
        results[index] = ("ok", dict(pg.reconfigurations), log, timings)
        manager.shutdown(wait=False)
    except BaseException as error:  # noqa: B902  (reported to the parent)
        import traceback

        results[index] = ("failed", traceback.format_exc(), log, [])
        raise SystemExit(1) from error


def runs(log):
    """A replica's steps in short: "3 committed at 4, 1 failed at 4, ..."."""
    out = []
    for what, size in log:
        if out and out[-1][1:] == [what, size]:
            out[-1][0] += 1
        else:
            out.append([1, what, size])
    return ", ".join(f"{n} {what} at {size}" for n, what, size in out)


def main():
    if harness._importable():
        print(f"skipped: cannot import torch and braid_torch: {harness._importable()}")
        raise SystemExit(harness.SKIP)
    try:
        import torchft  # noqa: F401
    except ImportError as error:
        print(f"skipped: cannot import torchft ({error}): scripts/install-deps.sh installs it")
        raise SystemExit(harness.SKIP)
    # The wheel puts it beside the interpreter (a venv's bin need not be on PATH).
    beside = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    program = beside if os.access(beside, os.X_OK) else shutil.which("torchft_lighthouse")
    if not program:
        print(f"skipped: no torchft_lighthouse beside {sys.executable} or on PATH "
              "(torchft's wheel installs it)")
        raise SystemExit(harness.SKIP)
    import torch.multiprocessing as mp

    # torchft's Rust parts log every quorum at INFO.
    os.environ["RUST_LOG"] = "warn"
    quiet = dict(os.environ)
    port = harness.free_port()
    # (Its log goes to a file: a pipe nobody reads would stop it once full.)
    said = tempfile.TemporaryFile(mode="w+")
    lighthouse = subprocess.Popen(
        [program, "--min_replicas", "3", "--bind", f"127.0.0.1:{port}", "--join_timeout_ms", "1000",
         "--quorum_tick_ms", "20", "--heartbeat_timeout_ms", "500"],
        stdout=said, stderr=subprocess.STDOUT, env=quiet)
    failures = []
    try:
        ctx = mp.get_context("spawn")
        shared = ctx.Manager()
        ready, committed_at_three, results = shared.dict(), shared.dict(), shared.dict()
        address = f"http://127.0.0.1:{port}"
        procs = {i: ctx.Process(target=replica_main,
                                args=(i, address, ready, committed_at_three, results))
                 for i in range(4)}
        for p in procs.values():
            p.start()
        deadline = time.monotonic() + 150
        survivors = [i for i in range(4) if i != VICTIM]
        while time.monotonic() < deadline:
            if all(committed_at_three.get(i, 0) >= STEPS_AT_THREE for i in survivors):
                break
            if lighthouse.poll() is not None:
                break
            time.sleep(0.05)
        else:
            failures.append("the survivors did not commit steps at three replicas")
        procs[NEWCOMER] = ctx.Process(target=replica_main,
                                      args=(NEWCOMER, address, ready, committed_at_three, results))
        procs[NEWCOMER].start()
        for p in procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for i, p in procs.items():
            if p.is_alive():
                p.kill()
                failures.append(f"replica {i} hung")
        if procs[VICTIM].exitcode != -signal.SIGKILL:
            failures.append(f"the victim (replica {VICTIM}) ended with {procs[VICTIM].exitcode}")
        for i in survivors + [NEWCOMER]:
            kind, detail, log, timings = results.get(i, ("failed", "no result", [], []))
            if kind == "failed":
                failures.append(f"replica {i}:\n{detail}\nits steps: {log}")
                continue
            print(f"replica {i}: reconfigured {detail} ({', '.join(timings)}); steps {runs(log)}")
            if i == NEWCOMER:
                if not detail.get("join"):
                    failures.append(f"replica {i} did not join by a grow: {detail}")
            elif not detail.get("shrink") or not (detail.get("grow") or detail.get("shrink+grow")):
                failures.append(f"replica {i} did not shrink and then grow: {detail}")
    finally:
        lighthouse.terminate()
        try:
            lighthouse.wait(timeout=10)
        except subprocess.TimeoutExpired:
            lighthouse.kill()
            lighthouse.wait()
    if failures:
        said.seek(0)
        print("the lighthouse said:\n" + said.read()[-4000:])
    for failure in failures:
        print(failure)
    if not failures:
        print("passed: shrunk after the kill, grown by the new replica")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
