"""What a run reports, on the main rank only: TensorBoard scalars, metrics.jsonl, summary.json, and a rich
progress bar on a terminal or plain periodic lines elsewhere. Other ranks get NullLogger."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

log = logging.getLogger("rlrun")

# metrics.jsonl holds only what a seeded run reproduces exactly; wall-clock figures go to TensorBoard,
# the console and summary.json.
TIMING_KEYS = ("charts/sps",)


class RunLogger:
    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        start_steps: int,
        progress: str,
        tensorboard: bool,
        history: Path | None = None,
    ):
        """`history`: the metrics.jsonl of the run this one continues in another folder (its lines up to
        start_steps open this run's file, so it reads as one run)."""
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        if history is not None and history.exists():
            self.metrics_path.write_text(history.read_text())
        _truncate_after(self.metrics_path, start_steps)
        self.writer = None
        # Made at the first metrics written: importing TensorBoard's writer costs a fraction of a second of start-up.
        self.tensorboard, self.start_steps = tensorboard, start_steps
        if progress == "auto":
            progress = "rich" if sys.stdout.isatty() else "plain"
        self.mode = progress
        self.bar = None
        self._swapped: list[tuple[logging.Handler, logging.Handler]] = []
        if progress == "rich":
            self._start_bar(total_steps, start_steps)

    def _start_bar(self, total_steps: int, start_steps: int) -> None:
        console = Console()
        self.bar = Progress(
            TextColumn("[bold]train"),
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

    def log(self, env_steps: int, metrics: dict[str, float]) -> None:
        """One log interval: a jsonl line, TensorBoard scalars and, without a bar, a console line."""
        record = {"env_steps": env_steps, **{k: v for k, v in metrics.items() if k not in TIMING_KEYS}}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # TensorBoard drops the points at steps >= purge_step: those after the checkpoint, not its own.
            purge = self.start_steps + 1 if self.start_steps else None
            self.writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge)
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, env_steps)
        if self.mode == "plain":
            shown = ", ".join(f"{k.split('/')[-1]}={_fmt(v)}" for k, v in metrics.items() if k in _CONSOLE_KEYS)
            log.info("env_steps=%d %s", env_steps, shown)

    def info(self, message: str, *args: object) -> None:
        if self.mode != "none":
            log.info(message, *args)

    def error(self, message: str, *args: object) -> None:
        log.error(message, *args)  # also with progress=none: a failure must be told

    def failed(self, error: str, overrides: list[str], resume: str | None) -> None:
        """summary.json of a run that failed: why, and the line that continues it when a checkpoint exists."""
        failed = {"status": "failed", "error": error, "overrides": overrides}
        self.summary(failed | ({"resume": resume} if resume else {}))

    def summary(self, summary: dict) -> None:
        with open(self.run_dir / "summary.json", "w") as f:
            json.dump(summary, f, indent=2)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            root = logging.getLogger()
            for original, rich_handler in self._swapped:
                root.removeHandler(rich_handler)
                root.addHandler(original)
        if self.writer is not None:
            self.writer.close()


class NullLogger:
    def progress(self, *args: object) -> None: ...
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


def _fmt(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _truncate_after(path: Path, env_steps: int) -> None:
    """On resume, drop lines logged after the checkpoint, so the file reads as one continuous run."""
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line and json.loads(line).get("env_steps", 0) <= env_steps]
    path.write_text("".join(line + "\n" for line in kept))
