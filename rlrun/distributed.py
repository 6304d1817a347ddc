"""Rank information and collectives for the process this runs in. The only module that reads RANK /
LOCAL_RANK / WORLD_SIZE and talks to torch.distributed; with world size 1 every reduction is the identity
and nothing is wrapped, so the same training code runs either way."""

from __future__ import annotations

import gc
import hashlib
import importlib
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn


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


def is_peer_loss(error: BaseException | str) -> bool:
    """Whether `error` (an exception, or a rank's recorded error message) is a collective failing because a
    peer rank is gone."""
    return isinstance(error, dist.DistBackendError) or any(p in str(error) for p in _PEER_LOSS)


def restart_count() -> int:
    """How often torch elastic has restarted this job's ranks (0 outside elastic, and before any restart)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def under_slurm() -> bool:
    """Whether this runs as (part of) a SLURM job, which the scheduler may requeue."""
    return "SLURM_JOB_ID" in os.environ


def requeue_count() -> int:
    """How often SLURM has requeued this job (after a preemption or a time limit; 0 outside SLURM)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0"))


def launched_externally() -> bool:
    """Started as one rank of a job rather than by rlrun's own launcher: by torchrun (or another elastic agent:
    RANK/WORLD_SIZE set), or as one task of a scheduler's job of several tasks (srun, Hydra's submitit launcher:
    each task is one rank), whose variables are then exported as torchrun's."""
    if "RANK" not in os.environ:
        os.environ.update(_scheduler_task())
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _scheduler_task() -> dict[str, str]:
    """torchrun's variables for a task of a SLURM job step of several tasks, or of submitit's local executor;
    none otherwise. Rank 0's node hosts the store, on a port derived from the job id (the same after a requeue)."""
    env = os.environ
    if "SLURM_PROCID" in env and int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        tasks = env["SLURM_STEP_NUM_TASKS"]
        per_node = re.match(r"\d+", env.get("SLURM_STEP_TASKS_PER_NODE", tasks)).group()  # "4(x2)": 4 on each of 2
        ids = (env["SLURM_PROCID"], tasks, env.get("SLURM_LOCALID", "0"), per_node)
        where = (first_host(env.get("SLURM_STEP_NODELIST", "localhost")), env.get("SLURM_JOB_ID", "0"))
    elif int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:
        tasks = env["SUBMITIT_LOCAL_NTASKS"]
        ids = (env["SUBMITIT_LOCAL_GLOBALID"], tasks, env["SUBMITIT_LOCAL_LOCALID"], tasks)
        where = ("127.0.0.1", env.get("SUBMITIT_LOCAL_JOB_ID", "0"))
    else:
        return {}
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return dict(zip(names, (*ids, where[0], str(20000 + int(where[1]) % 20000))))


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: "gpu[03-05,09],cpu1" -> "gpu03"."""
    m = re.match(r"([^,\[]+)(?:\[([^\],-]+))?", nodelist)
    return m.group(1) + (m.group(2) or "")


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


def torchrun_job() -> tuple[int, str] | None:
    """(rank, run id) when this process is one rank of a job of several started outside rlrun (torchrun, or the tasks
    of `srun rlrun train`), else None. The run id names the job: its rendezvous id, or SLURM's job id."""
    if not launched_externally() or int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return None
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id == "none" and "SLURM_JOB_ID" in os.environ:
        run_id = f"slurm-{os.environ['SLURM_JOB_ID']}"
    if run_id == "none":
        run_id = f"{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', '0')}"
    return int(os.environ["RANK"]), run_id


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
