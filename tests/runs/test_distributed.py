"""Distributed training with real gloo process groups and real processes: gradient equivalence, ranks in
sync, rank-0-only writes, global metrics, exact resume, failures, signals, torchrun, two nodes, sweeps."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from rlrun.algos.dqn import DQN, DQNConfig
from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import EnvSpec, Reductions, episodes_of
from rlrun.config import ModelConfig
from rlrun.distributed import RankContext
from rlrun.fast import accelerate
from rlrun.training.run_log import RunLog
from tests.conftest import TWO_RANKS, cli_env, free_port, on_gloo_ranks, read_jsonl, rlrun, torchrun_failures, train

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(240)]


MODELS = {"mlp": ModelConfig(), "lstm": ModelConfig(name="lstm", hidden_sizes=[16], shared=True, core_size=8)}


def one_update(
    ctx: RankContext, model: str = "mlp", fast: bool = False
) -> tuple[list[torch.Tensor], tuple, dict, list[str]]:
    """One PPO update (2 epochs of one minibatch) on this rank's columns of a fixed 8 x 4 rollout; returns the
    parameters after it, the update shape, the update's metrics as the training loop logs them and the accelerations
    that applied (`fast`: those that apply, as training swaps them in). A recurrent model's columns are whole env
    sequences, with their initial states and episode starts."""
    torch.manual_seed(0)
    per_rank = 4 // ctx.world_size
    cfg = PPOConfig(num_steps=8, num_minibatches=1, update_epochs=2)
    space, actions = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    algo = PPO(cfg, MODELS[model], EnvSpec(space, actions, per_rank), ctx.device, Reductions(ctx.mean_all))
    applied = accelerate(algo, None) if fast else []
    g = torch.Generator().manual_seed(123)
    full = {
        "obs": torch.randn(8, 4, 4, generator=g),
        "actions": torch.randint(0, 2, (8, 4), generator=g),
        "log_probs": torch.rand(8, 4, generator=g).log(),
        "values": torch.randn(8, 4, generator=g),
        "next_values": torch.randn(8, 4, generator=g),
        "rewards": torch.randn(8, 4, generator=g),
        "terminated": torch.rand(8, 4, generator=g) < 0.1,
        "truncated": torch.rand(8, 4, generator=g) < 0.05,
        "starts": torch.rand(8, 4, generator=g) < 0.2,
    }
    cols = slice(ctx.rank * per_rank, (ctx.rank + 1) * per_rank)
    for name, value in full.items():
        getattr(algo.rollout, name).copy_(value[:, cols])
    state_size = algo.rollout.initial_state.shape[1]
    algo.rollout.initial_state.copy_(torch.randn(4, state_size, generator=g)[cols])
    algo.wrap_learner(ctx.wrap)
    stats = algo.update(progress=0.0)
    run_log = RunLog(ctx, full_rollout=8)
    run_log.gather(False, episodes_of([], 8 * per_rank), stats)
    return [p.detach().clone() for p in algo.model.parameters()], algo.update_shape, run_log.update, applied


def _one_update_numpy(ctx: RankContext, model: str, fast: bool = False) -> tuple[list, tuple, dict, list[str]]:
    params, shape, metrics, applied = one_update(ctx, model, fast)
    return [p.numpy() for p in params], shape, metrics, applied


@pytest.mark.parametrize("model", list(MODELS))
def test_two_ranks_with_half_the_batch_each_equal_one_process_with_all(model):
    single, _, metrics, _ = one_update(RankContext(0, 0, 1, 1, torch.device("cpu")), model)
    results = on_gloo_ranks(partial(_one_update_numpy, model=model), timeout=120)
    assert results[0][1] == results[1][1]  # the same minibatch shape on both ranks: (8 steps x 2 envs, 1, 2)
    for rank in (0, 1):
        for a, b in zip(single, results[rank][0]):
            torch.testing.assert_close(a, torch.from_numpy(b), atol=1e-6, rtol=0)
        # What the loop logs is the global batch's loss, entropy, KL, clip fraction, explained variance: the
        # one process's, not one rank's half.
        assert results[rank][2].keys() == metrics.keys()
        for key, value in metrics.items():
            assert results[rank][2][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert any((a != b).any() for a, b in zip(single, one_update_initial(model)))  # the update did change them


def test_accelerated_ranks_equal_one_accelerated_process():
    """The minibatch step in numpy runs in one process only: ranks step through the learner, whose backward DDP syncs
    (were it to run there, each rank would step on its own half's gradient)."""
    single, _, _, applied = one_update(RankContext(0, 0, 1, 1, torch.device("cpu")), fast=True)
    assert "minibatch step in numpy" in applied
    results = on_gloo_ranks(partial(_one_update_numpy, model="mlp", fast=True), timeout=120)
    for rank in (0, 1):
        params, _, _, rank_applied = results[rank]
        assert "fused PPO loss" in rank_applied and "minibatch step in numpy" not in rank_applied
        for a, b in zip(single, params, strict=True):
            torch.testing.assert_close(a, torch.from_numpy(b), atol=1e-5, rtol=0)


def _dqn_accelerations(ctx: RankContext) -> list[str]:
    spec = EnvSpec(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), 2)
    algo = DQN(DQNConfig(), ModelConfig(hidden_sizes=[32, 32]), spec, ctx.device, Reductions(ctx.mean_all))
    return accelerate(algo, None)


def test_dqn_ranks_step_through_the_learner_ddp_syncs():
    """DQN's gradient step in numpy, as PPO's, in one process only."""
    assert "gradient step in numpy" in _dqn_accelerations(RankContext(0, 0, 1, 1, torch.device("cpu")))
    for applied in on_gloo_ranks(_dqn_accelerations, timeout=120).values():
        assert "fused DQN loss" in applied and "gradient step in numpy" not in applied


def one_update_initial(model: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    spec = EnvSpec(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), 4)
    algo = PPO(PPOConfig(num_steps=8), MODELS[model], spec, torch.device("cpu"))
    return [p.detach().clone() for p in algo.model.parameters()]


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_two_rank_run_stays_in_sync_and_only_rank0_writes(tmp_path):
    run = train(
        tmp_path, "run", *TWO_RANKS, "total_steps=8192", "checkpoint.every_steps=4096", "logging.every_steps=1024"
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["status"] == "completed"
    digests = summary["parameter_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert len(list((run / "tb").iterdir())) == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt_000000004096.pt", "ckpt_000000008192.pt"]
    assert sorted(p.name for p in run.iterdir()) == [
        ".hydra",
        "checkpoints",
        "elastic",
        "metrics.jsonl",
        "summary.json",
        "tb",
        "train.log",
    ]
    logged = sum(m.get("charts/episodes", 0) for m in read_jsonl(run / "metrics.jsonl"))
    per_rank = summary["episodes_per_rank"]
    assert logged == summary["episodes"] == sum(per_rank) and min(per_rank) > 0
    state = torch.load(run / "checkpoints" / "ckpt_000000008192.pt", weights_only=True)
    assert len(state["ranks"]) == 2


def test_two_rank_resume_is_exact(tmp_path):
    args = ["total_steps=8192", "checkpoint.every_steps=4096", "checkpoint.keep_last=5"]
    full = train(tmp_path, "full", *TWO_RANKS, *args)
    part = tmp_path / "part"
    shutil.copytree(full, part)
    (part / "checkpoints" / "ckpt_000000008192.pt").unlink()
    out = rlrun("train", f"resume={part}", cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-4000:]
    a = torch.load(full / "checkpoints" / "ckpt_000000008192.pt", weights_only=True)
    b = torch.load(part / "checkpoints" / "ckpt_000000008192.pt", weights_only=True)
    for k in a["algo"]["model"]:
        assert torch.equal(a["algo"]["model"][k], b["algo"]["model"][k]), k
    assert read_jsonl(full / "metrics.jsonl") == read_jsonl(part / "metrics.jsonl")
    assert json.loads((part / "summary.json").read_text())["world_size"] == 2


def test_failure_on_one_rank_ends_the_job_with_its_traceback(tmp_path):
    (tmp_path / "rank_envs.py").write_text(
        "import os, gymnasium as gym\n"
        "class Fragile(gym.Wrapper):\n"
        "    def __init__(self):\n"
        "        super().__init__(gym.make('CartPole-v1'))\n"
        "        self.t = 0\n"
        "    def step(self, action):\n"
        "        self.t += 1\n"
        "        if os.environ.get('RANK') == '1' and self.t == 300:\n"
        "            raise RuntimeError('env broke on rank one')\n"
        "        return self.env.step(action)\n"
        "gym.register('Fragile-v0', entry_point=Fragile)\n"
    )
    start = time.monotonic()
    out = rlrun(
        "train",
        *TWO_RANKS,
        "env.id=Fragile-v0",
        "env.imports=[rank_envs]",
        "total_steps=100000",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert time.monotonic() - start < 60
    assert "rank 1 failed" in out.stderr
    assert out.stderr.count("RuntimeError: env broke on rank one") == 1
    assert not processes_mentioning(str(tmp_path / "run"))


def test_sigint_stops_every_rank_with_a_final_checkpoint(tmp_path):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "rlrun",
        "train",
        *TWO_RANKS,
        "total_steps=10000000",
        "logging.every_steps=1024",
        f"hydra.run.dir={run}",
    ]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        for line in proc.stdout:
            if "env_steps=" in line:
                break
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        proc.wait(60)
        assert time.monotonic() - start < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["final_checkpoint"]
    assert Path(summary["final_checkpoint"]).exists()
    deadline = time.monotonic() + 10
    while processes_mentioning(str(run)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_mentioning(str(run))


def test_external_torchrun_runs_as_its_ranks_in_one_run_folder(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "rlrun",
            "train",
            "total_steps=4096",
            "logging.progress=plain",
            "eval.episodes=2",
            "eval.num_envs=2",
        ],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    runs = list((tmp_path / "outputs" / "torchrun").iterdir())
    assert len(runs) == 1
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["parameter_digests"][0] == summary["parameter_digests"][1]
    assert len(list((runs[0] / "tb").iterdir())) == 1


@pytest.mark.timeout(300)
def test_external_torchrun_exits_0_every_time(tmp_path):
    # Issue 39: 2 of 10 such jobs ended with rank 1 aborting at interpreter exit ("terminate called without an
    # active exception"), which torchrun reports as a failed job. Here 2 jobs side by side (a 20% failure rate passes
    # with probability 0.64); bench/learning/test_stress.py runs 20 (0.8**20: about 1%).
    failures = torchrun_failures(tmp_path, pairs=1)
    assert not failures, "\n".join(failures)


def test_two_nodes_on_loopback_form_one_job(tmp_path):
    port = free_port()
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlrun",
                "train",
                "distributed.nnodes=2",
                f"distributed.node_rank={n}",
                f"distributed.rdzv_endpoint=127.0.0.1:{port}",
                "total_steps=4096",
                "logging.progress=plain",
                "eval.episodes=2",
                "eval.num_envs=2",
                f"hydra.run.dir={tmp_path / f'node{n}'}",
            ],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=180) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    summary = json.loads((tmp_path / "node0" / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(set(summary["parameter_digests"])) == 1
    assert not (tmp_path / "node1" / "summary.json").exists()
    assert not (tmp_path / "node1" / "checkpoints").exists()


def test_multirun_runs_each_job_on_two_ranks(tmp_path):
    out = rlrun(
        "train",
        "-m",
        "seed=0,1",
        *TWO_RANKS,
        "total_steps=2048",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        timeout=200,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    for job in ("0", "1"):
        summary = json.loads((tmp_path / "sweep" / job / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["status"] == "completed"
