"""What a run reports, on the main rank only: a rich progress bar on a terminal or plain periodic lines elsewhere,
and, through one interface (Writer), the run folder's files (metrics.jsonl and summary.json: MetricsFile; TensorBoard)
and the experiment trackers (rlrun/trackers/). Other ranks get NullLogger."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rlrun.run_folder import writing
from rlrun.trackers import Trackers

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger("rlrun")

# metrics.jsonl holds only what a seeded run reproduces exactly; wall-clock figures go to TensorBoard,
# the console and summary.json.
TIMING_KEYS = ("charts/sps",)
# TensorBoard's HParams compares runs by these tags' last points: the final evaluation, and training's return.
HPARAMS_METRICS = ("eval/return_mean", "charts/episodic_return")


class Writer(Protocol):
    """Where a run's metrics go: every log interval's scalars at their env step, the summary at the end, and the
    run's status (summary.json's: completed | interrupted | failed) when it closes. A writer of the run folder
    (MetricsFile, TensorBoard) that fails ends the run, as any failed write does (run_folder.writing says why);
    the trackers turn their own failures into one warning (rlrun/trackers/)."""

    def log(self, metrics: dict[str, float], env_steps: int) -> None: ...
    def summary(self, summary: dict[str, Any]) -> None: ...
    def close(self, status: str) -> None: ...


class MetricsFile:
    """metrics.jsonl, one line per log interval with what a seeded run reproduces exactly (no wall-clock figures:
    those go to TensorBoard, the console and summary.json), and summary.json. `history`: the metrics.jsonl of the
    run this one continues in another folder (its lines up to start_steps open this run's file, so it reads as one
    run); lines after start_steps (a crash's, after the checkpoint resumed from) are dropped."""

    def __init__(self, run_dir: Path, start_steps: int, history: Path | None) -> None:
        self.path, self.summary_path = run_dir / "metrics.jsonl", run_dir / "summary.json"
        with writing(self.path):
            if history is not None and history.exists():
                self.path.write_text(history.read_text())
            _truncate_after(self.path, start_steps)

    def log(self, metrics: dict[str, float], env_steps: int) -> None:
        record = {"env_steps": env_steps, **{k: v for k, v in metrics.items() if k not in TIMING_KEYS}}
        with writing(self.path), open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def summary(self, summary: dict[str, Any]) -> None:
        with writing(self.summary_path), open(self.summary_path, "w") as f:
            json.dump(summary, f, indent=2)

    def close(self, status: str) -> None: ...


class TensorBoard:
    """The run's TensorBoard events (tb/): every scalar at its env step, and once per run folder, by the session that
    writes its first events file, the HParams entry (`hparams`: the config's scalars). The writer is made at the
    first point: importing it costs a fraction of a second of start-up."""

    def __init__(self, run_dir: Path, start_steps: int, hparams: dict[str, Any]) -> None:
        self.dir, self.start_steps, self.hparams = run_dir / "tb", start_steps, hparams
        self.writer: Any = None

    def log(self, metrics: dict[str, float], env_steps: int) -> None:
        with writing(self.dir):
            if self.writer is None:
                from torch.utils.tensorboard import SummaryWriter

                fresh = not any(self.dir.glob("events.out.tfevents.*"))
                # TensorBoard drops the points at steps >= purge_step: those after the checkpoint, not its own.
                purge = self.start_steps + 1 if self.start_steps else None
                self.writer = SummaryWriter(str(self.dir), purge_step=purge)
                if fresh:
                    _write_hparams(self.writer, self.hparams)
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, env_steps)

    def summary(self, summary: dict[str, Any]) -> None: ...

    def close(self, status: str) -> None:
        if self.writer is not None:
            with writing(self.dir):
                self.writer.close()


class RunLogger:
    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        start_steps: int,
        progress: str,
        tensorboard: bool,
        history: Path | None = None,
        every_seconds: float = 15.0,
        trackers: Callable[[int], Trackers] | None = None,
    ):
        """`history`: the metrics.jsonl of the run this one continues in another folder (MetricsFile). `every_seconds`:
        without a bar, the longest time between two console lines while training or evaluating, whatever the metrics
        interval. `trackers`: opens the experiment trackers, given the last env step this folder's earlier sessions
        logged; its `hparams` (the config's scalars) go to TensorBoard's HParams."""
        # Before MetricsFile drops a crash's lines past the checkpoint: the trackers have those steps already.
        logged_until = _last_step(run_dir / "metrics.jsonl")
        opened = trackers(logged_until) if trackers is not None else None
        self.writers: list[Writer] = [MetricsFile(run_dir, start_steps, history)]
        if tensorboard:
            self.writers.append(TensorBoard(run_dir, start_steps, opened.hparams if opened is not None else {}))
        if opened is not None:
            self.writers.append(opened)
        self._status = "failed"  # summary.json's, for the writers' close
        _quiet_failed_writes()
        if progress == "auto":
            progress = "rich" if sys.stdout.isatty() else "plain"
        self.mode = progress
        self.bar: Progress | None = None  # the progress bar (progress=rich)
        self.total_steps, self.every_seconds = total_steps, every_seconds
        self._last_line = time.monotonic()  # of the last console line without a bar
        self._eval: tuple[int, float] | None = None  # an evaluation under way: (its episodes, its start)
        self._swapped: list[tuple[logging.Handler, logging.Handler]] = []
        if progress == "rich":
            self._start_bar(total_steps, start_steps)
        if progress == "none":  # a quiet console, but train.log still says what the run did
            for handler in logging.getLogger().handlers:
                if type(handler) is logging.StreamHandler:
                    handler.addFilter(_not_file_only)

    def _start_bar(self, total_steps: int, start_steps: int) -> None:
        console = Console()
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.bar.add_task("train", total=total_steps, completed=start_steps, info="")
        # Console log lines go through the bar's console so they print above it instead of tearing it.
        root = logging.getLogger()
        for h in list(root.handlers):
            if type(h) is logging.StreamHandler:
                rich_handler = RichHandler(console=console, show_time=False, show_path=False, show_level=False)
                root.removeHandler(h)
                root.addHandler(rich_handler)
                self._swapped.append((h, rich_handler))
        self.bar.start()

    def progress(self, env_steps: int, sps: float, recent_return: float | None) -> None:
        if self.bar is not None:
            ret = "" if recent_return is None else f"return {recent_return:8.2f}"
            self.bar.update(self.task, completed=env_steps, info=f"{sps:7.0f} sps  {ret}")
        elif self.mode == "plain" and self._due():
            ret = "" if recent_return is None else f" return={recent_return:.4g}"
            done = env_steps / self.total_steps if self.total_steps else 1.0
            log.info("env_steps=%d/%d (%.0f%%) sps=%.0f%s", env_steps, self.total_steps, 100 * done, sps, ret)

    def _due(self) -> bool:
        """Whether a plain progress line is due (and, if so, from now the next one counts)."""
        now = time.monotonic()
        if now - self._last_line < self.every_seconds:
            return False
        self._last_line = now
        return True

    def eval_started(self, episodes: int, num_envs: int, cap: int | None) -> None:
        limit = "" if cap is None else f", at most {cap:,} steps each"
        self.info("evaluating %s on %s%s", _count(episodes, "episode"), _count(num_envs, "env"), limit)
        self._eval = (episodes, time.monotonic())
        if self.bar is not None:
            self.eval_task = self.bar.add_task("eval", total=episodes, info="")
        self._last_line = time.monotonic()

    def eval_progress(self, episodes_done: int, env_steps: int) -> None:
        """Called after every step of the eval envs: the bar on a terminal, a line every every_seconds elsewhere."""
        if self._eval is None:
            return
        if self.bar is not None:
            self.bar.update(self.eval_task, completed=episodes_done, info=f"{env_steps:,} env steps")
        elif self.mode == "plain" and self._due():
            episodes, start = self._eval
            elapsed = time.monotonic() - start
            eta = f", about {elapsed / episodes_done * (episodes - episodes_done):.0f} s left" if episodes_done else ""
            log.info("eval: %d/%d episodes, %d env steps, %.0f s%s", episodes_done, episodes, env_steps, elapsed, eta)

    def eval_finished(self, episodes: int, seconds: float, capped: int, cap: int | None) -> None:
        """Ends the evaluation's progress, and says so when episodes ran into the cap (an agent that never ends an
        episode, such as an untrained one that never serves in an Atari game, plays each one to it)."""
        self._eval = None
        if self.bar is not None:
            self.bar.remove_task(self.eval_task)
        if capped:
            limit = f"{cap:,}-step cap (eval.max_episode_steps)"
            self.info("eval: %d of %d episodes hit the %s", capped, episodes, limit)
        self.info("eval: %s in %.1f s", _count(episodes, "episode"), seconds)

    def log(self, env_steps: int, metrics: dict[str, float]) -> None:
        """One log interval: to every writer and, without a bar, a console line."""
        for writer in self.writers:
            writer.log(metrics, env_steps)
        shown = ", ".join(f"{k.split('/')[-1]}={_fmt(v)}" for k, v in metrics.items() if k in _CONSOLE_KEYS)
        if self.mode == "plain" and shown:  # (a stop's last interval may hold none of the console's keys)
            self._last_line = time.monotonic()
            log.info("env_steps=%d %s", env_steps, shown)

    def info(self, message: str, *args: object) -> None:
        """A line of what the run does (its start, evaluations, end): with progress=none, to train.log alone."""
        log.info(message, *args, extra={"file_only": self.mode == "none"})

    def error(self, message: str, *args: object) -> None:
        log.error(message, *args)  # also with progress=none: a failure must be told

    def failed(self, error: str, overrides: list[str], resume: str | None) -> None:
        """summary.json of a run that failed: why, and the line that continues it when a checkpoint exists."""
        failed = {"status": "failed", "error": error, "overrides": overrides}
        self.summary(failed | ({"resume": resume} if resume else {}))

    def summary(self, summary: dict[str, Any]) -> None:
        for writer in self.writers:
            writer.summary(summary)
        self._status = str(summary.get("status", "failed"))  # once summary.json holds it

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            root = logging.getLogger()
            for original, rich_handler in self._swapped:
                root.removeHandler(rich_handler)
                root.addHandler(original)
        for writer in self.writers:
            writer.close(self._status)


class NullLogger:
    def progress(self, *args: object) -> None: ...
    def eval_started(self, *args: object) -> None: ...
    def eval_progress(self, *args: object) -> None: ...
    def eval_finished(self, *args: object) -> None: ...
    def log(self, *args: object) -> None: ...
    def info(self, *args: object) -> None: ...
    def error(self, *args: object) -> None: ...
    def failed(self, *args: object) -> None: ...
    def summary(self, *args: object) -> None: ...
    def close(self) -> None: ...


_CONSOLE_KEYS = (
    "charts/episodic_return",
    "charts/sps",
    "eval/return_mean",
    "losses/approx_kl",
    "losses/entropy",
)


def _not_file_only(record: logging.LogRecord) -> bool:
    """The console's filter under progress=none: it drops RunLogger.info's lines, which train.log keeps."""
    return not getattr(record, "file_only", False)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _quiet_failed_writes() -> None:
    """A log file on a full disk drops its lines instead of printing a traceback for each, and TensorBoard's writer
    thread, which re-raises a failed write for threading to print, stays quiet too: the write that fails next in
    the run (metrics.jsonl, a checkpoint, the writer's next scalar) ends it with one line naming the error."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and not isinstance(handler.handleError, _DropOSError):
            handler.handleError = _DropOSError(handler.handleError)
    if not isinstance(threading.excepthook, _DropOSError):
        threading.excepthook = _DropOSError(threading.excepthook, thread="_AsyncWriterThread")


class _DropOSError:
    """Calls `handle` (a handler's handleError, threading's excepthook) unless the error being handled is an OSError
    (in a thread of the class named `thread`, for the hook)."""

    def __init__(self, handle: Callable[[Any], object], thread: str | None = None):
        self.handle, self.thread = handle, thread

    def __call__(self, arg: Any) -> None:  # a handler's record, or excepthook's ExceptHookArgs
        if self.thread is None:
            error, quiet = sys.exc_info()[1], True
        else:
            error, quiet = arg.exc_value, type(arg.thread).__name__ == self.thread
        if not (quiet and isinstance(error, OSError)):
            self.handle(arg)


def _write_hparams(writer: SummaryWriter, hparams: dict[str, Any]) -> None:
    """The run's hyperparameters, with HPARAMS_METRICS as its metrics, into the run's events file: HParams takes a
    metric's value from the last point of its scalar tag, so the final evaluation is the value it shows."""
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    metrics = dict.fromkeys(HPARAMS_METRICS, 0.0)
    experiment, session_start, _session_end = hparams_summaries(hparams, metrics)  # type: ignore[no-untyped-call]
    events = writer.file_writer
    assert events is not None, "SummaryWriter opens its file writer when it is made"
    events.add_summary(experiment)
    events.add_summary(session_start)


def _fmt(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _last_step(path: Path) -> int:
    """The env step of a metrics.jsonl's last line (0 without one)."""
    if not path.exists():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return int(json.loads(lines[-1]).get("env_steps", 0)) if lines else 0


def _truncate_after(path: Path, env_steps: int) -> None:
    """On resume, drop lines logged after the checkpoint, so the file reads as one continuous run."""
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line and json.loads(line).get("env_steps", 0) <= env_steps]
    path.write_text("".join(line + "\n" for line in kept))


if TYPE_CHECKING:  # mypy holds each writer to the one interface
    _writers: list[type[Writer]] = [MetricsFile, TensorBoard, Trackers]
