"""A real single-node SLURM on this machine for the cluster tests: munged, slurmctld and slurmd on localhost with a
minimal generated slurm.conf (one node with the machine's cores, free ports, every file in one folder), started and
reaped by the `slurm` fixture. Needs Debian's slurm-wlm and munge (`apt-get install slurm-wlm munge`) and root, as
slurmd does; without them the tests that use it are skipped.

    python -m tests.slurm_cluster FOLDER    # start one by hand (SLURM_CONF=FOLDER/slurm.conf); Ctrl-C stops it
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
MUNGE_KEY = Path("/etc/munge/munge.key")


def missing() -> str | None:
    """Why a local SLURM cannot run here, or None."""
    absent = [d for d in (*DAEMONS, "sbatch", "scontrol") if shutil.which(d) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd needs root"
    if not MUNGE_KEY.exists():
        return f"no munge key at {MUNGE_KEY}"
    return None


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _conf(folder: Path) -> str:
    host = socket.gethostname()
    ctld, slurmd = _free_ports(2)
    return f"""ClusterName=rlrun-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long before it may start again (120 s by default)
AuthInfo=socket={folder}/munge.socket,cred_expire=5
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmctldPort={ctld}
SlurmdPort={slurmd}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName={host} CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def start(folder: Path) -> dict[str, str]:
    """Start the three daemons with their files in `folder`; returns the environment the SLURM commands need."""
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    conf = folder / "slurm.conf"
    conf.write_text(_conf(folder))
    env = dict(os.environ, SLURM_CONF=str(conf))
    munge = [f"--socket={folder}/munge.socket", f"--key-file={MUNGE_KEY}", f"--pid-file={folder}/munged.pid"]
    munge += [f"--log-file={folder}/munged.log", f"--seed-file={folder}/munge.seed", "--force"]
    subprocess.run(["munged", *munge], check=True, env=env, timeout=30)
    subprocess.run(["slurmctld"], check=True, env=env, timeout=30)
    subprocess.run(["slurmd"], check=True, env=env, timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=30)
        if state.stdout.strip() == "idle":
            return env
        time.sleep(0.5)
    stop(folder, env)
    raise RuntimeError(f"the local SLURM did not come up; see {folder}/slurmctld.log and slurmd.log")


def stop(folder: Path, env: dict[str, str]) -> None:
    """Cancel what is still queued and wait for its steps to end, then end the daemons this folder's pid files name
    (and wait for them). A job step whose slurmd is gone cannot report its end and retries forever: one left over is
    killed."""
    subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _job_steps(env["SLURM_CONF"]):
        time.sleep(0.2)
    for name in reversed(DAEMONS):
        pid_file = folder / f"{name}.pid"
        if not pid_file.exists():
            continue
        pid = int(pid_file.read_text().split()[0])
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    for pid in _job_steps(env["SLURM_CONF"]):
        os.kill(pid, signal.SIGKILL)


def _job_steps(conf: str) -> list[int]:
    """The live slurmstepd processes of the SLURM configured by `conf` (each carries its SLURM_CONF)."""
    steps = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == "slurmstepd" and _alive(int(proc.name)):
                if f"SLURM_CONF={conf}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    steps.append(int(proc.name))
        except (OSError, ProcessLookupError):  # ended while read
            continue
    return steps


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]


def _leave(signum: int, frame: object) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    where = Path(sys.argv[1]).resolve()
    environment = start(where)
    print(f"SLURM is up: export SLURM_CONF={environment['SLURM_CONF']}; Ctrl-C (or SIGTERM) stops it", flush=True)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _leave)
    try:
        signal.pause()
    finally:
        stop(where, environment)
