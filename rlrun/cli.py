"""`rlrun <command> [hydra overrides]`: checks the overrides once (rlrun/compose/preflight.py: a typo ends with one
clear line and no run folder), then runs the command's Hydra app, which converts the config to typed objects and
calls down."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlrun.config import CONF_DIR, PlayConfig, TrainConfig, validate_play
from rlrun.errors import Fault, FolderHeld, Interrupted, NonFiniteError, NothingToDo, UserError
from rlrun.training.signals import (
    LoadsHeld,
    exit_at_once_on_a_further_signal,
    ignore_stops_after_exit_handlers,
    quiet_lost_signals,
    raise_from_handler,
    raise_missed,
)

COMMANDS = {
    "train": "train an agent:  rlrun train algo=ppo env=breakout seed=3 [key=value ...]",
    "play": "run a trained agent:  rlrun play checkpoint=PATH [episodes=10 video=true]",
    "report": "summarize a sweep or a folder of runs:  rlrun report outputs/multirun/DATE/TIME",
}
USAGE = (
    "usage: rlrun <command> [--help] [hydra overrides]\n\ncommands:\n"
    + "\n".join(f"  {name:<7}{text}" for name, text in COMMANDS.items())
    + "\n\n`rlrun <command> --help` lists the config groups and keys; `--cfg job` prints the composed config."
)


def fail(message: str, code: int = 2) -> None:
    print(f"rlrun: error: {message}", file=sys.stderr)
    sys.exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """User mistakes end with one line (exit 2); a failed env worker or rank with its own traceback, once
    (exit 1)."""
    try:
        yield
    except Exception as e:
        known = _known_error(e)
        if known is None:
            raise
        fail(*known)


def _known_error(e: BaseException) -> tuple[str, int] | None:
    """(message, exit code) for errors rlrun explains itself; None for a bug, which keeps its traceback."""
    if isinstance(e, UserError):  # before the imports below, which bring torch: a typo's line stays quick
        return str(e), 2
    if isinstance(e, (Fault, NonFiniteError)):
        return str(e), 1
    from rlrun.envs.pool import EnvWorkerError
    from rlrun.launch import failed_ranks

    if isinstance(e, EnvWorkerError):
        return str(e), 1
    message = failed_ranks(e)
    return None if message is None else (message, 1)


def _job_config(cfg: DictConfig, hc, overrides: list[str], run_dir: Path) -> tuple[TrainConfig, str, dict | None]:
    """A job's typed config (presets applied, checked), its YAML text (what checkpoints carry) and the checkpoint
    it resumes from (loaded), or None."""
    from rlrun.compose.job import job_threads, replay_checkpoint, train_config
    from rlrun.compose.presets import job_presets
    from rlrun.compose.store import to_yaml
    from rlrun.job_env import requeue_count, under_slurm

    hydra_dir = run_dir / hc.output_subdir if hc.output_subdir else None
    cfg, presets = job_presets(cfg, hc.runtime.choices, overrides, hydra_dir)
    typed, state = train_config(cfg, overrides, run_dir, requeued=requeue_count() > 0)
    if state is None:
        logging.getLogger("rlrun").info(presets)
    resumable = under_slurm() or typed.distributed.max_restarts > 0 or cfg.resume == "auto"
    typed = replay_checkpoint(typed, resumable)
    typed = job_threads(typed, OmegaConf.select(hc.launcher, "n_jobs", default=None))
    return typed, to_yaml(replace(typed, resume=None)), state


def _failure(e: Exception, known: tuple[str, int] | None) -> str:
    """What a sweep's job failed of: rlrun's own line for an error it explains, else the exception's type and text."""
    return known[0] if known else f"{type(e).__name__}: {e}"


def _record_failed(run_dir: Path, error: Exception, message: str, overrides: list[str]) -> None:
    """A failed sweep job's summary.json, which lets the sweep go on and `rlrun report` show why; none in a folder
    another live job holds (its own summary is still to come)."""
    summary = run_dir / "summary.json"
    # The run's own record stands: a failed training run's, or a failed resume's run's.
    if not summary.exists() and not isinstance(error, FolderHeld):
        with contextlib.suppress(OSError):  # a full disk: the error line already said why
            summary.write_text(json.dumps({"status": "failed", "error": message, "overrides": overrides}, indent=2))


def _train_job(cfg: DictConfig, hc, overrides: list[str], run_dir: Path) -> dict | None:
    from rlrun.distributed import from_env
    from rlrun.job_env import launched_externally
    from rlrun.launch import launch, setup_rank_logging
    from rlrun.train import train

    typed, config_yaml, state = _job_config(cfg, hc, overrides, run_dir)
    d = typed.distributed
    external = launched_externally()
    if d.nproc_per_node * d.nnodes > 1 and not external:
        return launch(typed, run_dir, config_yaml, typed.resume, overrides)
    ctx = from_env(typed.device)
    if external:  # a task of a SLURM job, say, in the Hydra job that every task runs: only rank 0 writes
        setup_rank_logging(ctx.rank, run_dir)
    return train(typed, run_dir, ctx, config_yaml, state, tuple(overrides))


def _job_folder(cfg: DictConfig, run_dir: Path) -> contextlib.AbstractContextManager:
    """The job holds its run folder while it runs (each job of a sweep its own). A run whose folder the command line
    names took it before Hydra wrote into it (main); other ranks' processes and other nodes' launchers write nothing
    and take nothing. An internal launcher holds it while its ranks run and restart."""
    from rlrun.job_env import torchrun_job
    from rlrun.run_folder import held

    job = torchrun_job()
    if (job is not None and job[0] != 0) or cfg.distributed.node_rank != 0:
        return contextlib.nullcontext()
    return held(run_dir)


def _named_run_folder(args: list[str]) -> Path | None:
    """The run folder of a single run when the command line names it (hydra.run.dir=, which a resume sets too), for
    the process that will write into it (rank 0, node 0): taken before Hydra writes .hydra/ and train.log there."""
    from rlrun.compose.hydra_compat import args_parser, parse_overrides
    from rlrun.job_env import torchrun_job

    parsed = args_parser().parse_args(args)
    job = torchrun_job()
    if parsed.multirun or (job is not None and job[0] != 0):
        return None
    values = {o.key_or_group: o.value() for o in parse_overrides(parsed.overrides)}
    run_dir = values.get("hydra.run.dir")
    if str(values.get("distributed.node_rank", 0)) != "0" or not isinstance(run_dir, str) or "${" in run_dir:
        return None  # another node's launcher, or a folder only Hydra can name (the job takes it: _job_folder)
    return Path(run_dir)


def train_task(cfg: DictConfig) -> float | None:
    """A training job inside Hydra's: a single run's (run_composed), or each job's of a sweep (train_app)."""
    from hydra.types import RunMode

    from rlrun.compose.hydra_compat import job_overrides

    hc = HydraConfig.get()
    overrides = job_overrides(hc)
    run_dir = Path(hc.runtime.output_dir)
    try:
        with _job_folder(cfg, run_dir):
            summary = _train_job(cfg, hc, overrides, run_dir)
    except NothingToDo as e:  # resume=auto or a requeue found the run complete
        logging.getLogger("rlrun").info("%s", e)
        return None
    except Exception as e:
        known = _known_error(e)
        if hc.mode != RunMode.MULTIRUN:
            if known is None:
                raise
            fail(*known)
        # One job of a sweep: record why it failed and let the sweep go on (a sweeper sees nan).
        message = _failure(e, known)
        logging.getLogger("rlrun").error("job %s failed: %s", hc.job.num, message)
        _record_failed(run_dir, e, message, overrides)
        return float("nan")
    if summary is None:  # a node without rank 0
        return None
    if summary["status"] == "interrupted":
        from rlrun.run_folder import release

        release(run_dir)  # before a scheduler's handler, which may end the process before main's finally would
        if _POOLED:  # the sweep process ends the sweep, and passes a scheduler's warning on
            sys.exit(128 + summary["signal"])
        if hc.mode == RunMode.MULTIRUN:  # the sweep stops here; the jobs after this one continue with it
            end_interrupted_sweep(Path(hc.sweep.dir), summary["signal"])
        _end_interrupted(summary["signal"])
    return summary["eval_return_mean"]  # what a Hydra sweeper optimizes


train_app = hydra.main(version_base=None, config_path=CONF_DIR, config_name="train")(train_task)
_POOLED = False  # this process is a worker of the joblib launcher, whose sweep process ends an interrupted sweep


def mark_pooled_job() -> None:
    """A job in a worker of hydra/launcher=joblib: a signal ends it as a job of any sweep, but the sweep process
    (hydra_plugins/rlrun_joblib_launcher) says how to continue the sweep, once, when all its running jobs ended."""
    global _POOLED
    _POOLED = True


def end_interrupted_sweep(sweep_dir: Path, signum: int) -> NoReturn:
    """A sweep a signal stopped (its running jobs checkpointed, the ones after them not started): the line that
    continues it, last, and exit 128 + signal."""
    from rlrun.run_folder import resume_command

    print(f"continue the sweep with: {resume_command(sweep_dir)}", flush=True)  # as the sweep's first and last lines
    _end_interrupted(signum)


def _end_interrupted(signum: int) -> NoReturn:
    """End a command whose training a signal stopped (its checkpoints written, its folders let go): exit 128 +
    signal. A scheduler's warning (SLURM's --signal, submitit's preemption) first runs the handler that was there
    before training (submitit's requeues the job), or SIGUSR1's default."""
    if signum in (signal.SIGUSR1, signal.SIGUSR2):
        os.kill(os.getpid(), signum)
    exit_at_once_on_a_further_signal(128 + signum)  # not killed by a second Ctrl-C while Python finalizes
    sys.exit(128 + signum)


@dataclass(frozen=True)
class SeedJob:
    """A job of a batch of seeds (hydra/launcher=batched), its folder made and held: what its training needs."""

    cfg: TrainConfig
    config_yaml: str
    resume_state: dict | None
    overrides: tuple[str, ...]
    run_dir: Path


def seed_job(cfg: DictConfig) -> SeedJob | None:
    """The batched launcher's task for each job of a batch, inside Hydra's job (its folder, .hydra/ and train.log
    made): the job's config, checked, and its folder held until train_seed_jobs lets it go; None for a job that
    has nothing to do (resume=auto of a complete run), which says so."""
    from rlrun.compose.hydra_compat import job_overrides
    from rlrun.run_folder import hold, release

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    with user_errors():
        hold(run_dir)
        try:
            typed, config_yaml, state = _job_config(cfg, hc, job_overrides(hc), run_dir)
        except NothingToDo as e:
            release(run_dir)
            logging.getLogger("rlrun").info("%s", e)
            return None
        except BaseException:
            release(run_dir)
            raise
    return SeedJob(typed, config_yaml, state, tuple(job_overrides(hc)), run_dir)


def train_seed_jobs(jobs: list[SeedJob], sweep_dir: Path) -> list[float]:
    """Train a batch's seeds side by side in this process (rlrun/seeds.py); each one's final eval return, as
    train_app returns a job's (nan for a seed that failed: its folder says why, and the others went on). A user
    mistake ends the sweep with one line; a failure of the batch as a whole marks every seed's folder failed and
    lets the sweep go on. A signal ends the sweep, every seed checkpointed, with the line that continues it."""
    from rlrun.distributed import from_env
    from rlrun.run_folder import release
    from rlrun.seeds import train_seeds
    from rlrun.training.parts import Run

    try:
        runs = [Run(j.cfg, j.run_dir, from_env(j.cfg.device), j.config_yaml, j.resume_state, j.overrides) for j in jobs]
        with user_errors():
            outcomes = train_seeds(runs)
    except Exception as e:
        message = _failure(e, _known_error(e))
        logging.getLogger("rlrun").error("batch of %d seeds failed: %s", len(jobs), message)
        for job in jobs:
            _record_failed(job.run_dir, e, message, list(job.overrides))
        return [float("nan")] * len(jobs)
    finally:
        for job in jobs:
            release(job.run_dir)
    signals = [o["signal"] for o in outcomes if isinstance(o, dict) and o["status"] == "interrupted"]
    if signals:  # the sweep stops here, as it does after an interrupted single job
        end_interrupted_sweep(sweep_dir, signals[0])
    return [float("nan") if isinstance(o, Exception) else o["eval_return_mean"] for o in outcomes]


def play_task(cfg: DictConfig) -> float:
    from rlrun.checkpoint import load_checkpoint
    from rlrun.compose.handoff import take
    from rlrun.compose.store import from_yaml
    from rlrun.play import play

    with user_errors():
        checked = take(cfg)  # what the pre-flight of this process checked and loaded
        if checked is None or checked.state is None:
            typed: PlayConfig = OmegaConf.to_object(cfg)
            validate_play(typed)
            state = load_checkpoint(typed.checkpoint)
        else:
            typed, state = checked.typed, checked.state
        result = play(typed, from_yaml(state["config"]), state, Path(HydraConfig.get().runtime.output_dir))
    return result["mean"]


play_app = hydra.main(version_base=None, config_path=CONF_DIR, config_name="play")(play_task)
APPS = {"train": train_app, "play": play_app}
TASKS = {"train": train_task, "play": play_task}


def _report(args: list[str]) -> None:
    import argparse

    from rlrun.report import METRICS, X_AXES, report

    parser = argparse.ArgumentParser(prog="rlrun report", description=COMMANDS["report"])
    parser.error = lambda message: fail(f"report: {message}")  # one line, as for every bad input
    parser.add_argument("paths", type=Path, nargs="+", metavar="PATH", help="multirun folders or folders of runs")
    parser.add_argument("--metric", choices=METRICS, default="eval", help="final eval return or training episodes")
    parser.add_argument("--x", choices=X_AXES, default="steps", help="curves over env steps or wall seconds")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two group labels (as in the table) or folders")
    parser.add_argument("--out", type=Path, help="where report.md and the PNGs go (default: PATH, or . for several)")
    parsed = parser.parse_args(args)
    with user_errors():
        report(parsed.paths, parsed.metric, parsed.x, parsed.compare, parsed.out)


def _interrupted(signum: int, frame: object) -> None:
    raise_from_handler(Interrupted(signum))


def main(argv: list[str] | None = None) -> None:
    from rlrun.job_env import launched_externally

    signal.signal(signal.SIGINT, _interrupted)  # not Python's own: see Interrupted
    atexit.register(ignore_stops_after_exit_handlers)  # first, so it runs after the exit handlers registered later
    quiet_lost_signals()
    sys.meta_path.insert(0, LoadsHeld())
    # SIGTERM at start-up as Ctrl-C: one line, and the run folder let go (it ended the process at once, silently,
    # leaving the lock file). Not in a rank of a job: a Python handler cannot run while the rank waits in the C++
    # rendezvous for a peer that may never come, and SIGTERM's default is what ends it then.
    if not launched_externally():
        signal.signal(signal.SIGTERM, _interrupted)
    try:
        _command(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt as e:  # a signal before training took over the signals (start-up), or a second in play
        signum = e.args[0] if isinstance(e, Interrupted) and e.args else signal.SIGINT
        fail("interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}", 128 + signum)


def _command(argv: list[str]) -> None:
    if not argv:  # a usage error, as git and argparse treat a missing command
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    if argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, args = argv[0], argv[1:]
    if command not in COMMANDS:
        fail(f"unknown command '{command}'; choose one of: {', '.join(COMMANDS)}")
    if command == "report":
        _report(args)
        return
    from rlrun.compose.hydra_compat import run_composed, runs_nothing
    from rlrun.compose.preflight import preflight
    from rlrun.compose.store import register_configs

    register_configs()  # the schemas the apps compose against
    try:
        with user_errors():
            checked = preflight(command, args)
    except NothingToDo as e:
        print(f"rlrun: {e}")
        return
    raise_missed()  # before any run folder: a signal during the config check (imports, the env) that was swallowed
    args = checked.args
    # printing a config needs no run folder (nor torch)
    folder = _named_run_folder(args) if command == "train" and not runs_nothing(args) else None
    from rlrun.run_folder import hold, release

    with user_errors():
        took = folder is not None and hold(folder)
    try:
        if checked.run is not None:  # a single run: the pre-flight's composition is the run's
            run_composed(command, checked.run, TASKS[command])
        else:  # a sweep, or a command that prints: Hydra's app, which composes for itself
            sys.argv = [f"rlrun {command}", *args]
            APPS[command]()
    finally:
        if took:
            release(folder)


if __name__ == "__main__":
    main()
