"""The environment a job's process was started in: by torchrun or another elastic agent (its restarts), as a task of
a SLURM job (its requeues) or of submitit's local executor, each rank's variables exported as torchrun's. Read
without torch, so the command line knows before it imports torch; rlrun/distributed.py builds on it."""

from __future__ import annotations

import os
import re


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
        counts = re.match(r"\d+", env.get("SLURM_STEP_TASKS_PER_NODE", tasks))  # "4(x2)": 4 on each of 2 nodes
        per_node = counts.group() if counts else tasks
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
    return m.group(1) + (m.group(2) or "") if m else nodelist


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
