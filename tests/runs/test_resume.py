"""A resumed, extended or restarted run is the same run: a resume that does not fit fails before it writes, one
record across sessions (summary.json, the report's groups, metrics.jsonl and TensorBoard without a point lost or
doubled at the seam), schedules that continue across a budget extension, and independent random streams."""

import json
from pathlib import Path

import pytest

from rlrun.report import find_runs, group_runs
from tests.conftest import assert_replay_seam_closed, read_jsonl, rlrun

SMALL = [
    "total_steps=2048",
    "eval.episodes=2",
    "eval.num_envs=2",
    "logging.every_steps=512",
    "logging.progress=plain",
    "checkpoint.every_steps=1024",
]


def folder_state(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def tensorboard_steps(run: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for events in sorted((run / "tb").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        steps += [e.step for e in accumulator.Scalars(tag)] if tag in accumulator.Tags()["scalars"] else []
    return sorted(steps)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_sweep_job_resumed_then_extended_stays_one_run_of_its_group(tmp_path):
    sweep = tmp_path / "sweep"
    out = rlrun("train", "-m", "seed=1,2", f"hydra.sweep.dir={sweep}", *SMALL, cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    job = sweep / "0"
    before = folder_state(job)
    (group,) = group_runs(find_runs([sweep]))
    assert len(group.runs) == 2

    # A config the checkpoint's networks cannot continue in: one line naming the difference, nothing written.
    for bad, message in [
        ("env.id=Acrobot-v1", "trained on CartPole-v1 with a 4-dim observation; env.id=Acrobot-v1 has 6"),
        ("model.hidden_sizes=[32,32]", "does not fit model.hidden_sizes=[32, 32] (the checkpoint's: [64, 64])"),
    ]:
        out = rlrun("train", f"resume={job}", bad, "total_steps=4096", cwd=tmp_path)
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    # A complete run without a larger budget: says so and changes nothing.
    out = rlrun("train", f"resume={job}", cwd=tmp_path)
    assert out.returncode == 0 and "nothing to do" in out.stdout, out.stdout + out.stderr[-2000:]
    assert folder_state(job) == before

    out = rlrun("train", f"resume={job}", "total_steps=4096", cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "learning rate continues from 1.3e-04, annealing to 0 at step 4,096" in out.stdout + out.stderr
    summary = json.loads((job / "summary.json").read_text())
    first, second = summary["sessions"]
    assert summary["overrides"] == first["overrides"] and "total_steps=2048" in summary["overrides"]
    assert second["overrides"] == ["total_steps=4096"] and second["resumed_from"].endswith("ckpt_000000002048.pt")
    assert (first["start_steps"], first["end_steps"], second["start_steps"], second["end_steps"]) == (
        0,
        2048,
        2048,
        4096,
    )
    assert first["ended"] == second["ended"] == "completed"
    assert summary["wall_seconds"] == pytest.approx(first["wall_seconds"] + second["wall_seconds"], abs=0.01)
    assert summary["episodes"] == first["episodes"] + second["episodes"] == summary["episodes_per_rank"][0]
    seconds = first["train_seconds"] + second["train_seconds"]
    assert summary["sps"] == pytest.approx(4096 / seconds, rel=0.01)

    # No line or point lost or doubled at the seam: every episode logged once, one TensorBoard point per step.
    metrics = read_jsonl(job / "metrics.jsonl")
    assert sum(m.get("charts/episodes", 0) for m in metrics) == summary["episodes"]
    logged = [m["env_steps"] for m in metrics if "charts/iteration" in m]
    assert logged == list(range(512, 4097, 512))
    assert tensorboard_steps(job, "charts/iteration") == logged

    # The learning rate goes on down from where it was, to 0 at the new total: no jump at the seam.
    rates = [m["charts/learning_rate"] for m in metrics if "charts/learning_rate" in m]
    drops = [a - b for a, b in zip(rates, rates[1:])]
    assert len(rates) == 8 and min(drops) > 0 and rates[-1] < rates[3] / 2, rates

    # The report keeps the job in its group: its identity is its original overrides.
    (group,) = group_runs(find_runs([sweep]))
    assert len(group.runs) == 2 and sorted(r.summary["env_steps"] for r in group.runs) == [2048, 4096]


def test_progress_is_exact_until_the_budget_changes_then_continues_from_the_last_update():
    from rlrun.schedule import Progress, resumed_progress

    never = Progress(3000)
    assert all(never(s) == s / 3000 for s in range(0, 3001, 7))  # bit for bit what a run without resume uses
    state = {"env_steps": 2000, "config": "total_steps: 2000\n", "schedule": never.state() | {"total_steps": 2000}}
    same, extended = resumed_progress(state, 2000, 100)
    assert not extended and same == Progress(2000)
    longer, extended = resumed_progress(state, 4000, 100)
    assert extended and longer(2000) == Progress(2000)(1900) == 0.95 and longer(4000) == 1.0
    assert longer.step_at(1.0) == 4000 and abs(longer(3000) - 0.975) < 1e-12
    old, _ = resumed_progress({"env_steps": 2000, "config": "total_steps: 2000\n"}, 4000, 100)
    assert old == longer  # a checkpoint from before schedules were saved ran on env_steps / total_steps


def test_no_two_seed_rank_pairs_share_a_torch_stream():
    import torch

    from rlrun.seeding import EVALUATION, RESUMED, TRAIN, torch_seed

    streams = {}
    for seed in range(4):
        for rank in range(4):
            for purpose in ((TRAIN,), (EVALUATION,), (RESUMED, 3)):
                gen = torch.Generator().manual_seed(torch_seed(seed, rank, *purpose))
                streams[(seed, rank, purpose)] = tuple(torch.rand(4, generator=gen).tolist())
    assert len(set(streams.values())) == len(streams) == 48
    assert torch_seed(1, 1, TRAIN) != torch_seed(2, 0, TRAIN)  # were both seed + rank = 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_restartable_sac_run_on_hopper_keeps_its_replay_and_no_item_spans_the_seam(tmp_path):
    import shutil

    pytest.importorskip("mujoco")
    run = tmp_path / "run"
    args = ["algo=sac", "env=hopper", "env.num_envs=2", "model.hidden_sizes=[32,32]", "algo.learning_starts=100"]
    args += ["total_steps=400", "checkpoint.every_steps=200", "eval.every_steps=0", "eval.episodes=1"]
    args += ["eval.num_envs=1", "logging.progress=plain"]
    # resume=auto: a run the machine may resume by itself checkpoints its replay without being told to.
    out = rlrun("train", f"hydra.run.dir={run}", "resume=auto", *args, cwd=tmp_path, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "checkpoints" / "shard_000000000200_rank0.pt").exists()

    part = tmp_path / "part"  # as if the job had died after its checkpoint at 200 steps
    shutil.copytree(run, part)
    for file in (part / "checkpoints").iterdir():
        if int(file.stem.split("_")[1]) > 200:
            file.unlink()
    out = rlrun("train", f"resume={part}", cwd=tmp_path, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert_replay_seam_closed(part, 200, 400, num_envs=2)

    # Without its replay, a resume says it starts on an empty one.
    for shard in (part / "checkpoints").glob("shard_*"):
        shard.unlink()
    out = rlrun("train", f"resume={part}", "total_steps=600", cwd=tmp_path, timeout=200)
    assert out.returncode == 0 and "the replay starts empty" in out.stdout + out.stderr, out.stderr[-3000:]


@pytest.mark.dist
@pytest.mark.timeout(200)
def test_a_two_rank_resume_whose_env_module_no_longer_imports_is_one_line_before_any_rank_starts(tmp_path):
    """The resume's env is built in the pre-flight, as a new run's is: a module in env.imports that the resuming
    command cannot import (another working folder) is one line and exit 2, not a rank's error after the ranks
    started (exit 1 and their tracebacks' noise), and the run folder is left as it was."""
    trained, elsewhere, run = tmp_path / "trained", tmp_path / "elsewhere", tmp_path / "run"
    trained.mkdir()
    elsewhere.mkdir()
    (trained / "my_envs.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('My/Cart-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv', max_episode_steps=200)\n"
    )
    args = ["env.imports=[my_envs]", "env.id=My/Cart-v0", "distributed.nproc_per_node=2", "algo.num_steps=64"]
    out = rlrun("train", *args, *SMALL, f"hydra.run.dir={run}", cwd=trained, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    before = folder_state(run)
    out = rlrun("train", f"resume={run}", "total_steps=4096", cwd=elsewhere, timeout=100)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert "env.imports: cannot import 'my_envs'" in out.stderr
    assert folder_state(run) == before
