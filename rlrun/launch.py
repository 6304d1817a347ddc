"""Starts the ranks of a multi-process job with torch's elastic launcher, from inside the Hydra app, handing
each the resolved config as YAML text and the run folder. World size 1 never comes here."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record

from rlrun.compose.store import from_yaml
from rlrun.config import TrainConfig
from rlrun.distributed import is_peer_loss
from rlrun.training.signals import forget_raised, raise_missed

log = logging.getLogger("rlrun")


def launch(
    cfg: TrainConfig, run_dir: Path, config_yaml: str, resume: str | None, overrides: list[str]
) -> dict[str, Any] | None:
    """Run cfg.distributed.nproc_per_node ranks on this node (of nnodes); returns rank 0's summary when
    rank 0 ran here. Raises ChildFailedError (see root_cause) when a rank fails."""
    import torch._dynamo  # noqa: F401  imported once here, so forked ranks do not each spend ~2 s on it
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    d = cfg.distributed
    # Threads per rank so that the ranks of a node share its cores (torchrun leaves this to the user).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // d.nproc_per_node)))
    single = d.nnodes == 1
    config = LaunchConfig(
        min_nodes=d.nnodes,
        max_nodes=d.nnodes,
        nproc_per_node=d.nproc_per_node,
        # One node: a c10d store on a free port (port 0), so parallel jobs never join each other's group.
        # Several nodes: the static rendezvous torchrun uses, node 0 hosting the store at rdzv_endpoint.
        run_id=uuid.uuid4().hex if single else "rlrun",
        rdzv_backend="c10d" if single else "static",
        rdzv_endpoint="localhost:0" if single else d.rdzv_endpoint,
        rdzv_configs={} if single else {"rank": d.node_rank},
        max_restarts=d.max_restarts,
        monitor_interval=0.1,
        start_method=d.start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "elastic")),
    )
    # The agent logs every rank's failure at length; rlrun reports the root cause once (root_cause).
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    raise_missed()  # the agent takes the signals from here: a start-up signal whose exception was lost ends here
    try:
        results = elastic_launch(config, rank_main)(config_yaml, str(run_dir), resume, overrides)
    except SignalException as e:  # Ctrl-C or SIGTERM reached the agent: exit as the signal says
        sys.exit(128 + int(e.sigval))
    summary: dict[str, Any] | None = results.get(0)  # rank_main's, by rank
    return summary


def failed_ranks(error: BaseException) -> str | None:
    """The one message for a job whose rank failed (root_cause), or None for any other error."""
    return root_cause(error) if isinstance(error, ChildFailedError) else None


def root_cause(error: ChildFailedError) -> str:
    """The failing rank and its traceback, once. Ranks that only failed because a peer died first (a
    broken connection in a collective) are not the cause; among the rest, the earliest error wins. All
    error files of this node are read, not only the ranks the agent happened to see fail, but for one a rank
    did not finish writing (torch's writer is not atomic)."""
    rank, first = error.get_first_failure()
    candidates = []
    folder = Path(first.error_file).parent.parent if first.error_file else None
    for path in sorted(folder.glob("*/error.json")) if folder else []:
        try:
            data = json.loads(path.read_text()).get("message", {})
        except ValueError:  # cut short: the agent stopped that rank while it wrote its own error (not the first)
            continue
        if isinstance(data, dict):
            trace = data.get("extraInfo", {}).get("py_callstack", data.get("message", ""))
            stamp = int(data.get("extraInfo", {}).get("timestamp", 0))
            peer_loss = is_peer_loss(data.get("message", ""))
            candidates.append((peer_loss, stamp, rank - first.local_rank + int(path.parent.name), trace))
    if not candidates:
        code = first.exitcode
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"rank {rank} failed with {how} (no traceback recorded)"
    _, _, rank, trace = min(candidates)
    last = trace.rstrip().splitlines()[-1] if trace.strip() else ""
    for kind in ("UserError", "Fault", "NonFiniteError"):  # bad input, a full disk, a NaN: one line
        if last.startswith(f"rlrun.errors.{kind}: "):
            return f"rank {rank}: {last.removeprefix(f'rlrun.errors.{kind}: ')}"
    return f"rank {rank} failed:\n{trace.rstrip()}"


def _die_with_launcher() -> None:
    """SIGTERM this rank when its launcher dies, so a killed job leaves no ranks behind."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def setup_rank_logging(rank: int, run_dir: Path) -> None:
    """Rank 0 logs to the console and train.log; the others print warnings only and write no file."""
    root = logging.getLogger()
    if rank != 0:  # other ranks write no files and print only warnings
        for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(handler)
        root.setLevel(logging.WARNING)
    elif not root.handlers:  # spawned: a fresh interpreter without the launcher's handlers
        root.addHandler(logging.StreamHandler(sys.stdout))
        root.addHandler(logging.FileHandler(run_dir / "train.log"))
        root.setLevel(logging.INFO)


@record
def rank_main(config_yaml: str, run_dir: str, resume: str | None, overrides: list[str]) -> dict[str, Any]:
    """One rank, started by the elastic agent (fork or spawn): everything it needs comes in its arguments."""
    from rlrun.checkpoint import load_checkpoint
    from rlrun.distributed import from_env
    from rlrun.job_env import restart_count
    from rlrun.run_folder import list_checkpoints
    from rlrun.train import train

    forget_raised()  # a forked rank's copy of the launcher's: the launcher stops the job for it
    _die_with_launcher()
    # The agent forwards Ctrl-C/SIGTERM to each rank once; out of the terminal's process group a rank does
    # not get the same signal twice (which would skip its final checkpoint).
    os.setpgrp()
    cfg = from_yaml(config_yaml)
    ctx = from_env(cfg.device)
    setup_rank_logging(ctx.rank, Path(run_dir))
    if restart_count() > 0:  # torch elastic restarted the job after a failure: continue from its newest checkpoint
        found = list_checkpoints(Path(run_dir) / "checkpoints")
        resume = str(found[-1]) if found else resume
        start = f"resuming from {resume}" if resume else "from the start"
        log.info("restart %d of the job: %s", restart_count(), start)
    state = load_checkpoint(resume) if resume else None
    summary = train(cfg, Path(run_dir), ctx, config_yaml, state, tuple(overrides))
    if summary["status"] == "interrupted":
        # The agent is shutting down and will not collect return values; a rank that returned would wait
        # for it (up to its 30 s kill timeout). Everything is written and closed: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + summary["signal"])
    return summary
