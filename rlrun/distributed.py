"""Rank information and collectives for the process this runs in. With rlrun/job_env.py (its torch-free half, which
the command line reads before it imports torch) the only module that reads RANK / LOCAL_RANK / WORLD_SIZE, and the
only one that talks to torch.distributed; with world size 1 every reduction is the identity and nothing is wrapped,
so the same training code runs either way."""

from __future__ import annotations

import gc
import hashlib
import importlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlrun.job_env import restart_count


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


# Messages a rank raises only because another rank died first; never the root cause.
_PEER_LOSS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "DistBackendError",
    "Broken pipe",
    "ProcessGroupGloo",
    "Socket Timeout",
    "SignalException",
)


def in_process_group() -> bool:
    """Whether this process is one of several ranks: RankContext.init forms a process group for several only."""
    return dist.is_available() and dist.is_initialized()


def is_peer_loss(error: BaseException | str) -> bool:
    """Whether `error` (an exception, or a rank's recorded error message) is a collective failing because a
    peer rank is gone."""
    return isinstance(error, dist.DistBackendError) or any(p in str(error) for p in _PEER_LOSS)


@dataclass(frozen=True)
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def init(self) -> None:
        """Join the process group. Call after forking env workers: gloo starts threads, and a fork after
        threads start can leave the child hung."""
        if self.distributed and not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            # torch._dynamo (which building DDP imports) takes a reference to the group when first imported after
            # the group formed, and destroy_process_group cannot drop it: gloo's threads (two pt_gloo_runloop, one
            # gloo_tcp_loop) would then outlive close() and run on through the interpreter's exit. So it comes first.
            # rlrun's own launcher imports it before forking the ranks; under torchrun, srun or submitit, here.
            importlib.import_module("torch._dynamo")  # (an import statement would make `torch` local here)
            # The store torch elastic's agent hosts (or rank 0, at MASTER_ADDR:MASTER_PORT), as env:// finds it. After
            # an elastic restart it still holds the dead attempt's keys, gloo's addresses among them: a rank reading
            # one would connect to a rank that is gone. Each attempt keeps its keys apart.
            store, _, _ = next(dist.rendezvous("env://", self.rank, self.world_size))
            store = dist.PrefixStore(f"rlrun/attempt_{restart_count()}/", store)
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size)

    def close(self) -> None:
        """Leave the process group and end it: its threads are joined here, not left to the interpreter's exit."""
        if self.distributed and dist.is_initialized():
            # The learner's DDP module, which holds the group, sits in reference cycles: collect them first, so that
            # destroy_process_group drops the group's last reference.
            gc.collect()
            dist.destroy_process_group()

    def mean_all(self, x: Tensor) -> Tensor:
        """The mean of `x` over ranks (every rank gets it)."""
        if not self.distributed:
            return x
        y = x.detach().clone().to(self.device)
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
        return (y / self.world_size).to(x.device)

    def any_all(self, flag: bool) -> bool:
        """True on every rank if it is True on any rank (e.g. a stop request seen by one rank)."""
        if not self.distributed:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def all_gather(self, obj: Any) -> list[Any]:
        """`obj` from every rank, in rank order, on every rank (small picklable objects)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather_all(self, x: Tensor) -> Tensor:
        """`x` from every rank stacked in rank order [W, ...], on every rank (small CPU tensors, every step)."""
        if not self.distributed:
            return x.unsqueeze(0)
        y = x.detach().to(self.device)
        out = [torch.empty_like(y) for _ in range(self.world_size)]
        dist.all_gather(out, y)
        return torch.stack(out).to(x.device)

    def finish_line(self) -> FinishLine | None:
        """The rollouts' finish line for straggler preemption (call after init), or None in one process."""
        if not self.distributed:
            return None
        # The c10d store the process group was formed on (torch elastic's, or the one at MASTER_ADDR): no new server.
        store = dist.distributed_c10d._get_default_store()
        return FinishLine(dist.PrefixStore("rlrun/rollouts/", store), self.rank, self.world_size)

    def wrap(
        self,
        module: nn.Module,
        trained: Iterable[nn.Parameter],
        find_unused_parameters: bool = False,
        sync_batchnorm: bool = True,
    ) -> nn.Module:
        """The learner as training calls it: in DDP when distributed, so its forward syncs the gradients of the
        `trained` parameters (rlrun/ddp.py); as it is otherwise."""
        if not self.distributed:
            return module
        from rlrun import ddp

        return ddp.wrap(module, trained, self.device, find_unused_parameters, sync_batchnorm)


class FinishLine:
    """DD-PPO's signal for preempting stragglers (Wijmans et al. 2020): each rank adds 1 to a counter in the process
    group's c10d store when its rollout is done, and a rank still collecting reads what fraction of ranks is done.
    One counter per rollout (the store's add is atomic), so no reset can race with a fast rank's next rollout. A read
    is a round trip to the store (tens of microseconds here, more across nodes): at most one per POLL_S."""

    POLL_S = 0.002

    def __init__(self, store: dist.Store, rank: int, world_size: int):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.rollout = 0
        self.done, self.polled = 0, 0.0

    def start(self) -> None:
        """A rollout starts on this rank (every rank starts each rollout once, in order)."""
        if self.rank == 0 and self.rollout > 0:
            # Every rank is past the previous rollout's counter: a collective (the update's) lay between them.
            self.store.delete_key(str(self.rollout - 1))
        self.rollout += 1
        self.done, self.polled = 0, 0.0

    def fraction_done(self) -> float:
        """The fraction of ranks that have finished this rollout, as last read from the store."""
        now = time.perf_counter()
        if now - self.polled >= self.POLL_S:
            self.done, self.polled = self.store.add(str(self.rollout - 1), 0), now
        return self.done / self.world_size

    def finish(self) -> None:
        """This rank's rollout is done (in full, or cut short)."""
        self.store.add(str(self.rollout - 1), 1)


def from_env(device: str) -> RankContext:
    """The context of this process: a rank of a job when RANK/WORLD_SIZE are set, else a single process."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return RankContext(rank, local_rank, world_size, local_world_size, resolve_device(device, local_rank))


def parameter_digest(module: nn.Module) -> str:
    """A short hash of all parameter and buffer values (BatchNorm's statistics): equal on every rank when DDP kept
    them in sync."""
    h = hashlib.sha256()
    for t in [*module.parameters(), *module.buffers()]:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
