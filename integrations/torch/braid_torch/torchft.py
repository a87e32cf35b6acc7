"""A braid process group for torchft.

torchft's Manager reconfigures its process group on every new quorum of
replicas. Where it can, this one goes on from the braid group it has
instead of making a new one:

- the new quorum is the old group less some members, in their order:
  the members shrink the old group (the others may be dead or gone);
- the old group's members come first, in their order, and new processes
  after them: the members grow the group (after a shrink, where some left)
  and the new processes join it;
- anything else, or a first quorum: a new group, as torchft's own groups
  are made.

    from braid_torch.torchft import ProcessGroupBraid
    manager = torchft.Manager(pg=ProcessGroupBraid(), ...)

The members learn where each comes from through the quorum's store, so
every one of them takes the same way. `reconfigurations` counts the ways
taken: "new", "shrink", "grow", "shrink+grow" (a member's), "join" (a new
process's side of a grow).
"""
import json
from collections import Counter
from datetime import timedelta
from typing import List, Optional

import torch
from torch.distributed import ProcessGroup as BaseProcessGroup
from torchft.process_group import ProcessGroupWrapper, create_store_client

from . import HAS_CUDA, _C

__all__ = ["ProcessGroupBraid", "plan"]

_MEMBER_KEY = "braid/torchft/member/{}"
_SHRINK_ABORT = 1


def plan(members):
    """What the members of a new quorum do, from where each comes.

    `members[r]` is new rank r's {"group", "rank", "size"}: the quorum id of
    the braid group it holds (None: none) and its rank and size there.
    Returns None for a new group, else (excluded, kept): the old ranks to
    shrink away, and how many old members come first in the new quorum
    (the ranks from `kept` on join by a grow).
    """
    group = members[0]["group"]
    if group is None:
        return None
    kept = 0
    while kept < len(members) and members[kept]["group"] == group:
        kept += 1
    if any(m["group"] == group for m in members[kept:]):
        return None  # an old member after a new one
    old = [m["rank"] for m in members[:kept]]
    if any(b <= a for a, b in zip(old, old[1:])):
        return None  # the old members in another order
    excluded = sorted(set(range(members[0]["size"])) - set(old))
    if not excluded and kept == len(members):
        return None  # the same members: the old group may have failed
    return excluded, kept


class ProcessGroupBraid(ProcessGroupWrapper):
    """A torchft process group over braid (see the module's text)."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._backend = None  # the braid backend of the group held
        self._group: Optional[int] = None  # the quorum it was made for
        self.reconfigurations: Counter = Counter()

    def getBackendName(self) -> str:
        return "torchft-braid"

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: Optional[int] = None,
        group_rank: Optional[int] = None,
        group_world_size: Optional[int] = None,
        global_ranks: Optional[List[int]] = None,
    ) -> None:
        self._replica_id = replica_id
        self._quorum_id = quorum_id
        self._group_rank = group_rank
        self._group_world_size = group_world_size
        self._rank = rank
        self._global_ranks = global_ranks
        store = create_store_client(store_addr, timeout=self._timeout)
        held = self._backend
        mine = {"group": self._group if held is not None else None,
                "rank": held.rank() if held is not None else None,
                "size": held.size() if held is not None else None}
        store.set(_MEMBER_KEY.format(rank), json.dumps(mine))
        members = [json.loads(store.get(_MEMBER_KEY.format(r))) for r in range(world_size)]
        way = plan(members)
        # Until this one is made, this process holds no group to go on from.
        self._backend, self._group = None, None
        if way is None:
            self.abort(errored=False)
            backend = _C.create_process_group(store, rank, world_size, self._timeout)
            taken = "new"
        elif rank >= way[1]:
            self.abort(errored=False)
            backend = _C.join_grown(store, rank, world_size, self._timeout)
            taken = "join"
        else:
            excluded, kept = way
            backend, steps = held, []
            if excluded:
                backend = backend.shrink(excluded, _SHRINK_ABORT, None)
                steps.append("shrink")
            if world_size > kept:
                backend = _C.grow(backend, store, world_size)
                steps.append("grow")
            taken = "+".join(steps)
        self._pg = _wrap(backend, store, rank, world_size)
        self._backend, self._group = backend, quorum_id
        self.reconfigurations[taken] += 1


def _wrap(backend, store, rank: int, size: int) -> BaseProcessGroup:
    pg = BaseProcessGroup(store, rank, size)
    kind = BaseProcessGroup.BackendType.CUSTOM
    pg._set_default_backend(kind)
    pg._register_backend(torch.device("cpu"), kind, backend)
    if HAS_CUDA and torch.cuda.is_available():
        pg._register_backend(torch.device("cuda"), kind, backend)
    return pg
