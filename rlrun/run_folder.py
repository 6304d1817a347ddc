"""Where a run folder keeps its checkpoints: names, listing, the newest, the run a checkpoint belongs to; the lock
that lets one job at a time write into a run folder; a failed write as one Fault naming the file. Plain paths, no
torch, so that the pre-flight finds a missing checkpoint quickly."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rlrun.errors import Fault, FolderHeld, UserError

_PREFIX = "ckpt_"


def checkpoint_name(env_steps: int) -> str:
    return f"{_PREFIX}{env_steps:012d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in `directory`, oldest first (names sort by step)."""
    return sorted(directory.glob(f"{_PREFIX}*.pt")) if directory.is_dir() else []


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given, or the newest checkpoint of a run folder (or of its checkpoints/)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        found = list_checkpoints(p / "checkpoints") or list_checkpoints(p)
        if found:
            return found[-1]
        jobs = sorted(d.name for d in p.iterdir() if d.is_dir() and list_checkpoints(d / "checkpoints"))
        if jobs:  # a sweep's folder without its multirun.yaml (the Optuna sweeper writes none)
            raise UserError(
                f"{p} holds the runs {', '.join(jobs)}, not one run: resume each with resume={p}/N (a sweep whose "
                "folder holds multirun.yaml resumes whole)"
            )
        raise UserError(f"no checkpoint in {p} (expected {p}/checkpoints/{_PREFIX}*.pt)")
    raise UserError(f"checkpoint not found: {p} (give a checkpoint file or a run folder)")


def is_newest(checkpoint: Path) -> bool:
    """Whether no checkpoint of a later step lies beside `checkpoint`."""
    found = list_checkpoints(checkpoint.parent)
    return not found or found[-1].name <= checkpoint.name


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint was saved in, if it sits in one."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """A failed write of `path` (a full disk, an I/O error, no permission, a read-only folder, a file over the size
    limit) becomes one Fault naming the file and the error, whatever wraps the OSError (torch's zip writer raises
    its own error over it, and a second OSError while closing the file)."""
    try:
        yield
    except Exception as e:
        cause = _os_error(e)
        if cause is None:
            raise
        name = errno.errorcode.get(cause.errno, str(cause.errno))
        raise Fault(f"could not write {path}: {cause.strerror or cause} ({name})") from e


def _os_error(e: BaseException | None) -> OSError | None:
    """The first OSError with an errno in `e`'s chain of causes, from the outermost in."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno is not None:
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in `run_dir` from its newest checkpoint."""
    return f"rlrun train resume={run_dir}"


def resume_line(run_dir: Path) -> str | None:
    """resume_command, when `run_dir` has a checkpoint to continue from."""
    return resume_command(run_dir) if list_checkpoints(run_dir / "checkpoints") else None


def newest_line(run_dir: Path) -> str:
    """What a failed run leaves to continue from: its newest complete checkpoint and the line that resumes it."""
    found = list_checkpoints(run_dir / "checkpoints")
    if not found:
        return "no checkpoint was written before it"
    return f"newest complete checkpoint: {found[-1]}; continue with: {resume_command(run_dir)}"


LOCK_NAME = ".rlrun.lock"
_held: dict[Path, int] = {}  # the run folders this process holds: folder -> the open lock file


def hold(run_dir: Path) -> bool:
    """Take `run_dir` for this job before anything is written into it: an flock on its lock file, which the kernel
    releases when the holder dies, with the holder's host, pid and start recorded in it. A folder another job holds
    is a UserError naming the holder, and nothing is written; a lock file left by a holder that is gone (killed) is
    taken over with one line saying so. Returns whether this call took it (False: this process holds it already)."""
    key = run_dir.resolve()
    if key in _held:
        return False
    path = run_dir / LOCK_NAME
    while True:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"cannot write into run folder {run_dir}: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise FolderHeld(
                f"run folder {run_dir} is in use by another job ({holder}); wait for it to end or choose another "
                f"hydra.run.dir (lock file {path})"
            ) from None
        # The holder removes the file as it releases it: a lock on the removed file holds nothing, so open it anew.
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        os.close(fd)
    if os.fstat(fd).st_size:  # a released lock file is removed: this one's holder ended without releasing it
        print(f"rlrun: run folder {run_dir} was held by {_holder(fd)}, which is gone: taking it over", file=sys.stderr)
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": since})
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode() + b"\n", 0)
    _held[key] = fd
    return True


def release(run_dir: Path) -> None:
    """Give up a run folder this process holds: the lock file goes first, so the next job finds no stale holder."""
    fd = _held.pop(run_dir.resolve(), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            (run_dir / LOCK_NAME).unlink()
        os.close(fd)


@contextlib.contextmanager
def held(run_dir: Path) -> Iterator[None]:
    """`run_dir` held for the block (hold), and released after it unless the process held it before."""
    took = hold(run_dir)
    try:
        yield
    finally:
        if took:
            release(run_dir)


def holder_of(run_dir: Path) -> str | None:
    """Who holds `run_dir` now ("host H, pid P, since T"), or None when no live job does; takes nothing."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file: nobody holds it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)  # (a shared lock taken here goes with it)
    return None


def abandoned(run_dir: Path) -> bool:
    """Whether a run folder without a summary has no live job that this machine can see: no lock file (its job ended
    without one, or never took the folder), or this host's lock file that no process holds (its job was killed).
    Another host's lock cannot be seen from here: that job counts as live."""
    try:
        record = json.loads((run_dir / LOCK_NAME).read_text() or "{}")
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("host") not in (None, socket.gethostname()):
        return False
    return holder_of(run_dir) is None


def _holder(fd: int) -> str:
    """ "host H, pid P, since T" from a lock file's record."""
    try:
        record = json.loads(os.pread(fd, 4096, 0))
        return f"host {record['host']}, pid {record['pid']}, since {record['since']}"
    except (ValueError, KeyError, TypeError):
        return "a job that has not recorded itself yet"
