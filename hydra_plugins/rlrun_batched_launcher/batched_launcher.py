"""Hydra's launcher for `hydra/launcher=batched` (conf/hydra/launcher/batched.yaml): it groups a sweep's jobs that
differ only in `seed` into batches of at most max_batch, makes each job's folder as Hydra's basic launcher does
(.hydra/, train.log), and trains each batch in this process with rlrun.cli.train_seed_jobs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


def batches(jobs: list[tuple[int, list[str]]], max_batch: int) -> list[list[tuple[int, list[str]]]]:
    """The jobs (number, overrides) grouped by their overrides other than `seed=`, in the order each group first
    appears, each group cut into batches of at most max_batch."""
    groups: dict[tuple[str, ...], list[tuple[int, list[str]]]] = {}
    for job in jobs:
        key = tuple(sorted(o for o in job[1] if o.split("=", 1)[0].lstrip("+~") != "seed"))
        groups.setdefault(key, []).append(job)
    return [group[i : i + max_batch] for group in groups.values() for i in range(0, len(group), max_batch)]


class BatchedLauncher(Launcher):
    def __init__(self, max_batch: int = 8) -> None:
        if max_batch < 1:
            raise ValueError(f"hydra.launcher.max_batch={max_batch} must be at least 1")
        self.max_batch = max_batch
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        # The task function (train_app, one job per call) is not used: a batch trains its jobs in one call.
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from rlrun.cli import train_seed_jobs

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        jobs = [(initial_job_idx + i, list(o)) for i, o in enumerate(job_overrides)]
        # What a batch cannot train was refused before Hydra started (rlrun/compose/preflight.py).
        configs = {idx: self._job_config(idx, overrides) for idx, overrides in jobs}
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        returns: dict[int, JobReturn] = {}
        for batch in batches(jobs, self.max_batch):
            log.info(
                "Training %d seed%s in one process: %s",
                len(batch),
                "s" if len(batch) > 1 else "",
                ", ".join(f"#{i}" for i, _ in batch),
            )
            for idx, overrides in batch:
                log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            made = self._make_jobs([configs[idx] for idx, _ in batch])
            returns |= {idx: r for (idx, _), r in zip(batch, made)}
            training = [r for r in made if r.return_value is not None]  # None: nothing to do (said so)
            if training:
                _route_logs([r.return_value.run_dir for r in training])
                values = train_seed_jobs([r.return_value for r in training], sweep_dir)
                for r, value in zip(training, values):
                    r.return_value = value
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return [returns[idx] for idx, _ in jobs]

    def _job_config(self, idx: int, overrides: list[str]) -> DictConfig:
        assert self.config is not None and self.hydra_context is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = idx
            config.hydra.job.num = idx
        return config

    def _make_jobs(self, configs: list[DictConfig]) -> list[JobReturn]:
        """The batch's jobs made (_make_job), their folders held; on a failure, those made are let go and the sweep
        stops, as it does when a single job's config fails its checks."""
        from rlrun.run_folder import release

        made: list[JobReturn] = []
        try:
            for config in configs:
                job = self._make_job(config)
                if job.status != JobStatus.COMPLETED:
                    raise job.return_value
                made.append(job)
        except BaseException:
            for job in made:
                if job.return_value is not None:
                    release(job.return_value.run_dir)
            raise
        return made

    def _make_job(self, config: DictConfig) -> JobReturn:
        """The job's folder, .hydra/ and train.log, as Hydra's basic launcher makes them; its return value is the
        job's SeedJob (rlrun.cli.seed_job), or None when it has nothing to do."""
        from rlrun.cli import seed_job

        assert self.hydra_context is not None
        return run_job(
            hydra_context=self.hydra_context,
            task_function=seed_job,
            config=config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )


def _route_logs(run_dirs: list[Path]) -> None:
    """Each seed's log lines into its own folder's log file (Hydra's job logging opened the last job's only), the
    batch's own lines into all of them; the console shows the batch's, the leading seed's (the first still
    training) and every seed's warnings and errors."""
    from rlrun.seeds import SeedLogFilter

    root = logging.getLogger()
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    for h in files:
        root.removeHandler(h)
        h.close()
    for h in root.handlers:
        h.addFilter(SeedLogFilter(None, every_seed_from=logging.WARNING))
    if not files:  # job logging without a file (hydra/job_logging=disabled)
        return
    name = Path(files[0].baseFilename).name
    for run_dir in run_dirs:
        handler = logging.FileHandler(run_dir / name)
        handler.setFormatter(files[0].formatter)
        handler.addFilter(SeedLogFilter(run_dir))
        root.addHandler(handler)
