"""Each process composes a run's config once, checks it once and loads the checkpoint it resumes from once: counted
as the real calls happen (tests/data/counted_cli.py runs the CLI with Hydra's config loader, validate_train and
torch.load each noting its calls), for a run, its resume on one rank and on two, and a play of it."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import DATA, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.dist]

RUN = ["total_steps=1024", "checkpoint.every_steps=512", "eval.episodes=1", "logging.progress=plain"]


def counted(tmp_path: Path, *args: str) -> dict[int, Counter[str]]:
    """`rlrun ARGS` (must succeed) with its calls counted: per process, how many of each kind (`compose`, `validate`,
    `load NAME`: torch.load of the file NAME)."""
    counts = tmp_path / "counts"
    counts.unlink(missing_ok=True)
    out = subprocess.run(
        [sys.executable, str(DATA / "counted_cli.py"), *args],
        cwd=tmp_path, env={**cli_env(), "RLRUN_COUNTS": str(counts)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    calls: dict[int, Counter[str]] = {}
    for line in counts.read_text().splitlines():
        pid, kind, detail = line.split(" ", 2)
        calls.setdefault(int(pid), Counter())[kind if kind != "load" else f"load {detail}"] += 1
    return calls


def test_a_run_and_its_resumes_compose_check_and_load_once_per_process(tmp_path):
    run = tmp_path / "run"
    (calls,) = counted(tmp_path, "train", *RUN, f"hydra.run.dir={run}").values()
    assert calls == Counter(compose=1, validate=1)

    older = "ckpt_000000000512.pt"  # resuming from it starts a new run folder
    resume = [f"resume={run / 'checkpoints' / older}", "total_steps=1536", "eval.episodes=1"]
    (calls,) = counted(tmp_path, "train", *resume, f"hydra.run.dir={tmp_path / 'one'}").values()
    assert calls == Counter({"compose": 1, "validate": 1, f"load {older}": 1})

    launcher, *ranks = counted(tmp_path, "train", *resume, "distributed.nproc_per_node=2").values()
    assert launcher == Counter({"compose": 1, "validate": 1, f"load {older}": 1})
    assert len(ranks) == 2
    for rank in ranks:  # handed the resolved config as text: no composition, no checks; its own checkpoint load
        assert rank[f"load {older}"] == 1 and not rank["compose"] and not rank["validate"]

    newest = "ckpt_000000001024.pt"
    (calls,) = counted(tmp_path, "play", f"checkpoint={run}", "episodes=1", f"hydra.run.dir={tmp_path / 'p'}").values()
    assert calls == Counter({"compose": 1, f"load {newest}": 1})
