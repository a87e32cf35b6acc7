"""PyTorch's own distributed tests (DistributedTest._DistTestBase, from
torch.testing._internal.distributed.distributed_test) on backend "braid",
the way PyTorch runs them for Gloo (test/distributed/test_distributed_spawn.py):
every test spawns WORLD_SIZE processes that meet through a FileStore.

    WORLD_SIZE=2 python3 pytorch_suite.py                 # the whole suite
    WORLD_SIZE=2 python3 pytorch_suite.py --subset ci     # CI's subset
    WORLD_SIZE=4 python3 pytorch_suite.py -k test_all_reduce
    WORLD_SIZE=2 python3 pytorch_suite.py --backend gloo  # the same on Gloo

The suite gates tests on backend names. Here "braid" is added to the
features it has (DistTestCases: ddp, subgroup, plugin, and gpu where it
takes CUDA tensors), and the tests
that PyTorch runs only for Gloo because they name it, where what they test
is generic CPU behaviour, are run too (GLOO_ONLY_BUT_GENERIC). Tests that
cannot pass on braid are listed in NOT_FOR_BRAID with the reason; the
README's list is this one.
"""
import os
import sys

import harness

# --backend gloo: the same suite on Gloo, untouched (the reference tally).
BACKEND = "braid"
if "--backend" in sys.argv:
    at = sys.argv.index("--backend")
    BACKEND = sys.argv[at + 1]
    del sys.argv[at:at + 2]
os.environ["BACKEND"] = BACKEND
# PyTorch's test utilities read CI (any value) as "this is PyTorch's own CI":
# they then write JUnit XML through a module not installed here and skip
# tests marked periodic. The suite is to run the same here as anywhere.
os.environ.pop("CI", None)
os.environ.setdefault("WORLD_SIZE", "2")
if harness._importable():
    print(f"skipped: cannot import torch and braid_torch with {sys.executable}: {harness._importable()}")
    raise SystemExit(harness.SKIP)

import braid_torch  # noqa: E402,F401  (registers "braid", here and in every spawned rank)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# "gpu": the backends that take CUDA tensors, which braid does where it was
# built against a CUDA torch (tests that need GPUs still skip without them).
for feature in ("ddp", "subgroup", "plugin") + (("gpu",) if braid_torch.HAS_CUDA else ()):
    DistTestCases.backend_feature[feature].add("braid")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

# Skipped by the suite for every backend but Gloo only because of its name;
# what they test is generic CPU behaviour, which braid has too.
GLOO_ONLY_BUT_GENERIC = {
    # batch_isend_irecv on CPU tensors.
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    # all_reduce_coalesced.
    *(f"test_all_reduce_coalesced_{group}{op}" for group in ("", "group_", "full_group_")
      for op in ("sum", "product", "min", "max")),
    # DDP's no_sync, its futures and hooks, on CPU.
    "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook", "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_get_future", "test_grads_same_across_ranks_with_no_sync", "test_static_graph_multi_forward",
    "test_sync_bn_logged",
    # Object collectives.
    "test_scatter_object_list",
    # A group's timeout, given when it is made.
    "test_barrier_timeout_global", "test_barrier_timeout_group", "test_barrier_timeout_full_group",
    # monitored_barrier.
    "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup", "test_monitored_barrier_gloo_rank_0_timeout",
    "test_monitored_barrier_failure_order", "test_monitored_barrier_wait_all_ranks",
}

# Tests that cannot pass on braid, with the reason.
NOT_FOR_BRAID = {
    "test_ddp_logging_data_cpu": "DDP's logging data names the backend of a third-party group 'custom' "
                                 "(torch's ProcessGroup::getBackendName for BackendType::CUSTOM), not 'braid'",
    "test_sparse_all_reduce_sum": "sparse tensors: braid carries dense ones",
}

# Generic CPU tests whose body takes its CPU path only where the backend is
# named "gloo" or "mpi" (else the NCCL path): run with the name "gloo" in
# the body.
GLOO_PATH_IN_BODY = {
    "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook", "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
}

# CI's subset: one test of each collective, point-to-point, groups,
# DDP and the error paths, at most 5 minutes on 2 cores.
CI_SUBSET = [
    "test_broadcast", "test_all_reduce_sum", "test_all_reduce_max", "test_reduce_sum",
    "test_all_gather", "test_all_gather_coalesced_simple", "test_all_reduce_coalesced_sum",
    "test_all_to_all", "test_all_to_all_single_unequal_split",
    "test_send_recv", "test_isend", "test_irecv", "test_barrier", "test_gather", "test_scatter",
    "test_batch_isend_irecv_gloo", "test_monitored_barrier_gloo", "test_barrier_timeout_group",
    "test_new_subgroups", "test_get_backend", "test_DistributedDataParallelCPU",
    "test_accumulate_gradients_no_sync", "test_all_reduce_sum_async", "test_scatter_object_list",
]


class TestBraid(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


def _unskip(name):
    """Takes back the skip the suite gave the test for not being Gloo (an
    attribute of the function, copied onto the wrappers around it)."""
    test = getattr(TestBraid, name)
    while test is not None:
        if getattr(test, "__unittest_skip__", False):
            test.__unittest_skip__ = False
        test = getattr(test, "__wrapped__", None)


def _gloo_path_in_body(name):
    import functools

    from torch.testing._internal.distributed import distributed_test

    test = getattr(TestBraid, name)

    @functools.wraps(test)
    def run(self, *args, **kwargs):
        named = distributed_test.BACKEND
        distributed_test.BACKEND = "gloo"
        try:
            return test(self, *args, **kwargs)
        finally:
            distributed_test.BACKEND = named

    setattr(TestBraid, name, run)


if BACKEND == "braid":
    import unittest

    for _name in GLOO_ONLY_BUT_GENERIC:
        _unskip(_name)
    for _name in GLOO_PATH_IN_BODY:
        _gloo_path_in_body(_name)
    for _name, _why in NOT_FOR_BRAID.items():
        setattr(TestBraid, _name, unittest.skip(f"not for braid: {_why}")(getattr(TestBraid, _name)))


if __name__ == "__main__":
    if "--subset" in sys.argv:
        at = sys.argv.index("--subset")
        subset = sys.argv[at + 1]
        del sys.argv[at:at + 2]
        if subset != "ci":
            raise SystemExit(f"unknown subset {subset!r}; known: ci")
        sys.argv += [f"TestBraid.{name}" for name in CI_SUBSET]
    run_tests()
