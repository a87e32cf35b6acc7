"""examples/train.py under braid-run and under torchrun, 2 ranks each: both
finish, every rank reports backend "braid" and the same parameters, and
both launchers train to the same parameters.

    /usr/bin/python3 test_launchers.py BRAID_RUN
"""
import os
import re
import subprocess
import sys

import harness

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "train.py")


def run(command):
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    lines = re.findall(r"rank (\d)/2 backend (\w+) loss \S+ checksum (\S+)", done.stdout)
    if done.returncode != 0 or len(lines) != 2:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}")
    return lines


def main():
    if harness._importable():
        print(f"skipped: cannot import torch and braid_torch: {harness._importable()}")
        raise SystemExit(harness.SKIP)
    braid_run = sys.argv[1]
    results = {
        "braid-run": run([braid_run, "-n", "2", sys.executable, TRAIN]),
        # torchrun as `-m torch.distributed.run`: the one of this interpreter's
        # torch, whatever `torchrun` comes first on PATH.
        "torchrun": run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", TRAIN]),
    }
    checksums = set()
    for launcher, lines in results.items():
        print(launcher, lines)
        for rank, backend, checksum in lines:
            if backend != "braid":
                raise SystemExit(f"{launcher}: rank {rank} ran on backend {backend}")
            checksums.add(checksum)
    if len(checksums) != 1:
        raise SystemExit(f"the ranks or launchers disagree: checksums {sorted(checksums)}")
    print("passed: both launchers, same parameters on every rank")


if __name__ == "__main__":
    main()
