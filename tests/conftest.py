"""The one module of shared test helpers (test modules import from here, never from each other): run the real CLI
in a subprocess (with a timeout, reaped), short training runs and what they leave (W&B's offline files read back),
real gloo groups, envs that misbehave on purpose, and the check that no test leaves processes behind. bench/learning
imports them too."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlrun.algos.batched_ppo import BatchedPPO
from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import EnvSpec
from rlrun.compose.store import register_configs
from rlrun.config import CONF_DIR, EnvConfig, ModelConfig, TrainConfig
from rlrun.distributed import from_env
from rlrun.envs import SyncEnvs, env_seeds, make_env
from rlrun.fast import accelerate
from rlrun.seeding import TRAIN, torch_seed
from rlrun.seeds import streams_now

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

# CartPole solved, with room for another CPU's numerics: PPO's default run ends at 500 here (AVX2), and a trajectory
# moves with the kernels' float sums; a random policy scores about 20.
SOLVED = 400
# A short PPO CartPole run: checkpoints at 2048 and 4096 steps, evaluations at both, 8 metric lines.
SMALL = [
    "total_steps=4096",
    "eval.every_steps=2048",
    "eval.episodes=4",
    "eval.num_envs=2",
    "logging.every_steps=512",
    "logging.progress=plain",
    "checkpoint.every_steps=2048",
    "checkpoint.keep_last=5",
]
# The same run on two ranks of one node (overrides placed before a test's own, which may change them).
TWO_RANKS = ["distributed.nproc_per_node=2", "logging.progress=plain", "eval.episodes=4", "eval.num_envs=2"]
# The spaces of Pendulum-v1 for SAC and TD3 built without an env.
PENDULUM = EnvSpec(gym.spaces.Box(-8.0, 8.0, (3,)), gym.spaces.Box(-2.0, 2.0, (1,)), num_envs=1)
SMALL_NET = ModelConfig(hidden_sizes=[16, 16], activation="relu")
# CleanRL dqn.py's CartPole settings (its target sync every 500 env steps = 50 updates here; no grad clipping),
# for 50k steps instead of 500k. With them the replay must start updates at exactly its size, and the MSE loss
# learns (eval 489 / 312 / 177 at 50k on seeds 1-3) where Huber lets Q run away (eval about 9 on all three). The
# spread over seeds is what another CPU's numerics can do to seed 1: the bound is below the worst of them.
DQN_CLEANRL = [
    "algo=dqn", "total_steps=50000", "algo.lr=2.5e-4", "algo.buffer_size=10000", "algo.learning_starts=10000",
    "algo.batch_size=128", "algo.n_step=1", "algo.train_freq=10", "algo.gradient_steps=1",
    "algo.target_update_interval=50", "algo.tau=1.0", "algo.start_e=1.0", "algo.end_e=0.05",
    "algo.exploration_fraction=0.5", "algo.max_grad_norm=1000", "env.num_envs=1", "model.hidden_sizes=[120,84]",
    "model.activation=relu", "eval.every_steps=10000", "eval.episodes=10", "logging.progress=plain",
    "checkpoint.every_steps=0",
]  # fmt: skip


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", SDL_VIDEODRIVER="dummy")
    env.pop("HYDRA_FULL_ERROR", None)
    return env


# Where ale_py's C++ initialisation calls Python: nanobind making its enums through Python's enum (signalling_site's).
ALE_PY_INIT = ("entering(frame, arg, 'ale_py._ale_py')", "frame.f_code.co_name == '_create_'")


def signalling_site(enter: str, at: str, where: str = "True") -> str:
    """A sitecustomize.py that sends its process SIGTERM, and writes `sent` in its working folder, from inside a C call:
    at the first Python call (`at`, of `frame`) made while one runs that `enter` (of `frame` and `arg` at a 'c_call';
    `entering(frame, arg, NAME)` matches importlib running the init of extension modules named NAME...), in a
    process that `where` picks (checked there)."""
    return (
        "import os, signal, sys\n"
        "inside = []\n"
        "def entering(frame, arg, name):  # importlib calling the init of an extension module named name...\n"
        "    if getattr(arg, '__name__', '') not in ('create_dynamic', 'exec_dynamic'):\n"
        "        return False\n"
        "    target = frame.f_locals.get('args', (None,))[0]  # create_dynamic's spec, exec_dynamic's module\n"
        "    module = target.__name__ if isinstance(target, type(sys)) else getattr(target, 'name', None)\n"
        "    return isinstance(module, str) and module.startswith(name)\n"
        "def hook(frame, event, arg):\n"
        f"    if event == 'c_call' and {enter}:\n"
        "        inside.append(arg)\n"
        "    elif event in ('c_return', 'c_exception') and arg in inside:\n"
        "        inside.remove(arg)\n"
        f"    elif event == 'call' and inside and {at}:  # a Python function the C code calls\n"
        "        sys.setprofile(None)\n"
        f"        if {where}:\n"
        "            open('sent', 'w').close()\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.setprofile(hook)\n"
    )


def rlrun(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m rlrun ARGS` in `cwd`; subprocess.run kills the child if it outlives `timeout`."""
    return subprocess.run(
        [sys.executable, "-m", "rlrun", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train(tmp_path: Path, name: str, *args: str, timeout: float = 240) -> Path:
    """A `rlrun train` run in tmp_path/name that must succeed; returns its run folder."""
    run = tmp_path / name
    out = rlrun("train", f"hydra.run.dir={run}", *args, cwd=tmp_path, timeout=timeout)
    assert out.returncode == 0, out.stderr[-4000:]
    return run


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str, float]:
    """(stdout, stderr, seconds taken) of a run that must end within `timeout`; killed (and the test failed) if not."""
    start = time.monotonic()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return stdout, stderr, time.monotonic() - start


def assert_run_folder(run: Path, summary: dict) -> None:
    """What a completed PPO run's folder holds: its config, log, one TensorBoard events file, and metrics.jsonl in
    step order up to the summary's env steps, with PPO's losses and training returns."""
    assert (run / ".hydra" / "config.yaml").exists() and (run / "train.log").read_text()
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1
    metrics = read_jsonl(run / "metrics.jsonl")
    steps = [m["env_steps"] for m in metrics]
    assert steps == sorted(steps) and steps[-1] == summary["env_steps"]
    assert any("losses/approx_kl" in m and "charts/episodic_return" in m for m in metrics)


def play_and_record(run: Path, folder: Path) -> float:
    """`rlrun play` of a run: 3 episodes (their mean return, read from play's table), then one recorded as a video
    (asserted written)."""
    out = rlrun("play", f"checkpoint={run}", "episodes=3", f"hydra.run.dir={folder / 'play'}", cwd=folder)
    assert out.returncode == 0, out.stderr
    mean = float(re.search(r"mean\s*│\s*(-?[\d.]+)", out.stdout).group(1))
    video = ["episodes=1", "video=true", f"hydra.run.dir={folder / 'video'}"]
    out = rlrun("play", f"checkpoint={run}", *video, cwd=folder)
    assert out.returncode == 0, out.stderr
    videos = list((folder / "video" / "videos").glob("*.mp4"))
    assert videos and videos[0].stat().st_size > 1000
    return mean


def final_state(run: Path) -> dict:
    return torch.load(sorted((run / "checkpoints").glob("ckpt_*.pt"))[-1], weights_only=True)


def resumed_copy(tmp_path: Path, full: Path, steps: int, timeout: float = 180) -> Path:
    """A copy of the run folder `full` as if its job had died after the checkpoint at `steps` env steps (the later
    checkpoints, their replay shards and the summary gone), resumed to its end; returns the copy."""
    part = tmp_path / "part"
    shutil.copytree(full, part)
    for file in (part / "checkpoints").iterdir():
        if int(file.stem.split("_")[1]) > steps:
            file.unlink()
    (part / "summary.json").unlink()
    out = rlrun("train", f"resume={part}", cwd=tmp_path, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return part


def assert_replay_seam_closed(part: Path, resumed_at: int, end: int, num_envs: int, frame_stack: int = 1) -> None:
    """In run folder `part`, resumed on fresh episodes from its checkpoint at `resumed_at` env steps and checkpointed
    at `end` with its replay (rank 0's shard): every episode open at the newest row before the resume ended there, a
    truncation bootstrapping from the observation that would have come next (the checkpoint's cursor; its newest
    frame, for frame stacks, whose older frames take rows of their own before the first), and the next row starts
    new ones."""
    checkpoints = part / "checkpoints"
    cursor = torch.load(checkpoints / f"ckpt_{resumed_at:012d}.pt", weights_only=True)["ranks"][0]["cursor"]
    replay = torch.load(checkpoints / f"shard_{end:012d}_rank0.pt", weights_only=True)
    seam = frame_stack - 1 + resumed_at // num_envs - 1  # a row per vector step
    assert (replay["terminated"][seam] | replay["truncated"][seam]).all()
    assert replay["first"][seam + 1].all()
    finals = dict(zip(replay["final_items"].tolist(), replay["final_frames"]))
    for env in range(num_envs):
        if not replay["terminated"][seam, env]:
            expected = cursor["next_obs"][env] if frame_stack == 1 else cursor["next_obs"][env][-1]
            assert torch.equal(finals[seam * num_envs + env].double(), expected.double())


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def best_eval(run: Path) -> float:
    return max(m["eval/return_mean"] for m in read_jsonl(run / "metrics.jsonl") if "eval/return_mean" in m)


def typed(*overrides: str) -> TrainConfig:
    """The train config composed from conf/ with `overrides`, as the typed dataclasses."""
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return OmegaConf.to_object(compose("train", overrides=list(overrides)))


CPU = torch.device("cpu")


@dataclass
class Batch:
    """Seeds side by side in a BatchedPPO, as rlrun/seeds.py builds them: each seed's PPO and envs as its single run
    builds them, the batch over them, the accelerations that applied (algo.fast: rlrun/fast/)."""

    seeds: list[int]
    algos: list[PPO]
    envs: list[SyncEnvs]
    batch: BatchedPPO
    applied: list[str]

    def train(self, updates: int) -> list[list[float]]:
        """`updates` iterations of collect and update; each seed's epochs per update."""
        epochs: list[list[float]] = [[] for _ in self.seeds]
        for i in range(updates):
            self.batch.collect(self.envs)
            for s, stats in enumerate(self.batch.update(progress=i / updates)):
                epochs[s].append(stats["epochs"])
        return epochs

    def close(self) -> None:
        for e in self.envs:
            e.close()


def seed_run(cfg: PPOConfig, env: EnvConfig, seed: int, device: torch.device = CPU) -> tuple[PPO, SyncEnvs]:
    """A seed's PPO and envs as its single run builds them (rlrun/training/parts.py): torch's global generator seeded
    for the seed's training stream before the model is built, envs reset on the seed's env seeds. The global
    generator is left where the seed's stream stands after building."""
    envs = SyncEnvs([make_env(env, train=True) for _ in range(env.num_envs)])
    torch.manual_seed(torch_seed(seed, 0, TRAIN))
    spec = EnvSpec(envs.single_observation_space, envs.single_action_space, env.num_envs)
    algo = PPO(cfg, ModelConfig(), spec, device)
    algo.start(envs.reset(seed=env_seeds(seed, 0, env.num_envs))[0])
    return algo, envs


def ppo_batch(cfg: PPOConfig, env: EnvConfig, seeds: list[int], fast: bool, device: torch.device = CPU) -> Batch:
    """The seeds in one BatchedPPO (each built with algo.fast=false and its random streams taken, as rlrun/seeds.py
    builds them), its parts accelerated when `fast`."""
    built, streams = [], []
    for seed in seeds:
        built.append(seed_run(replace(cfg, fast=False), env, seed, device))
        streams.append(streams_now(device))
    algos, envs = [a for a, _ in built], [e for _, e in built]
    on_device = [d for _, d in streams if d is not None]
    batch = BatchedPPO(algos, [g for g, _ in streams], on_device or None, fast=fast)
    return Batch(seeds, algos, envs, batch, accelerate(batch, envs))


def sac_batch(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A replay batch of `n` Pendulum-shaped transitions for SAC and TD3."""
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, 3, generator=g),
        "actions": torch.rand(n, 1, generator=g) * 2 - 1,
        "returns": torch.randn(n, generator=g),
        "next_obs": torch.randn(n, 3, generator=g),
        "discount": torch.full((n,), 0.99),
    }


def continuous_run(algo: str, fast: bool, activation: str = "relu", updates=(1, 2, 3), **settings):
    """SAC or TD3 on Pendulum-shaped batches of 16 (TD3: a policy step between delayed ones), updated at each of
    `updates` from the same networks on the same batches and noise: (the algorithm, the accelerations applied).
    `settings`: of the algorithm's config."""
    from rlrun.algos import SACConfig, TD3Config, build_algo

    torch.manual_seed(0)
    config = SACConfig if algo == "sac" else TD3Config
    cfg = config(fast=fast, batch_size=16, **settings)
    a = build_algo(cfg, ModelConfig(hidden_sizes=[16, 16], activation=activation), PENDULUM, torch.device("cpu"))
    applied = accelerate(a, None)
    a.sync_targets()
    for step in updates:
        a.updates = step
        g = torch.Generator().manual_seed(step)
        noise = torch.randn((1 + cfg.policy_frequency, 16, 1) if algo == "sac" else (16, 1), generator=g)
        a.learn(sac_batch(16, seed=step), torch.ones(16), noise)
    return a, applied


def chi2_quantile(df: int, z: float = 3.09) -> float:
    """The 0.999 quantile of chi-square(df) (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


class Faulty(gym.Env):
    """CartPole-shaped env that misbehaves on a chosen step: raise, hang, segfault, or return a NaN observation (any
    other mode: never)."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, mode: str, at_step: int = 3):
        self.mode, self.at_step, self.t = mode, at_step, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == self.at_step:
            if self.mode == "raise":
                raise ValueError("boom in step")
            if self.mode == "hang":
                time.sleep(60)
            if self.mode == "segfault":
                import ctypes
                import faulthandler

                faulthandler.disable()  # pytest's crash dump would only clutter the test log
                ctypes.string_at(0)
            if self.mode == "nan":
                return np.full(4, np.nan, np.float32), 1.0, False, False, {}
        return np.zeros(4, np.float32), 1.0, False, False, {}


def assert_reaped(pool) -> None:
    """Close a WorkerPool and check that every worker process has exited."""
    pool.close()
    assert all(p.exitcode is not None for p in pool.procs)


def _torchrun_job(run: Path) -> subprocess.Popen:
    """One finished external-torchrun job, as short as a run can be: one iteration, one eval episode."""
    args = ["total_steps=2048", "eval.episodes=1", "eval.num_envs=1", "checkpoint.every_steps=0"]
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "rlrun", "train", *args, "logging.progress=none", "logging.tensorboard=false", f"hydra.run.dir={run}"],
        cwd=run.parent,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def torchrun_failures(tmp_path: Path, pairs: int) -> list[str]:
    """Runs `pairs` x 2 short two-rank jobs under an external torchrun, two at a time; what went wrong in each that
    did not exit 0 with a completed run."""
    failures = []
    for pair in range(pairs):
        jobs = {run: _torchrun_job(run) for run in (tmp_path / f"run{pair}_{k}" for k in range(2))}
        try:
            for run, job in jobs.items():
                _, err = job.communicate(timeout=240)
                if job.returncode != 0 or "terminate called" in err:
                    failures.append(f"{run.name}: exit {job.returncode}: {err[-1500:]}")
                elif json.loads((run / "summary.json").read_text())["status"] != "completed":
                    failures.append(f"{run.name}: not completed")
        finally:
            for job in jobs.values():
                if job.poll() is None:  # the agent takes its ranks with it
                    job.send_signal(signal.SIGTERM)
                    job.wait(30)
    return failures


@pytest.fixture(scope="module")
def ray_cluster():
    """Two Ray nodes of 2 CPUs each on this machine; its address (the test is skipped without the ray extra)."""
    cluster_utils = pytest.importorskip("ray.cluster_utils", reason="the ray extra is not installed")
    nodes = cluster_utils.Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2})
    try:
        nodes.add_node(num_cpus=2)
        nodes.wait_for_nodes()
        yield nodes.address
    finally:
        nodes.shutdown()


def on_ray(address: str, *args: str) -> list[str]:
    """Overrides that put a run's envs on Ray actors of the cluster at `address`."""
    return ["env.vector.backend=ray", f"env.vector.ray_address={address}", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_rank(rank: int, world: int, port: int, queue, job: Callable) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ctx = from_env("cpu")
    ctx.init()
    try:
        queue.put((rank, job(ctx)))  # numpy or plain data: no tensor fd sharing to outlive the process
    finally:
        ctx.close()


def on_gloo_ranks(job: Callable, world: int = 2, timeout: float = 150) -> dict:
    """{rank: job(ctx)} from `world` spawned processes joined in a real gloo group on a free port; they are
    reaped (killed if they linger) before this returns. `job` must be picklable (module level or a partial)."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, world, port, queue, job)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return dict(queue.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def wandb_records(path: Path):
    """The records of a W&B run file (run-ID.wandb): W&B's header, then LevelDB log blocks of 32 KiB whose chunks
    (FULL=1, FIRST=2, MIDDLE=3, LAST=4) carry one protobuf Record each."""
    from wandb.proto import wandb_internal_pb2 as wandb_pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # the block's padding
            pos += left
            continue
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_pb.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def wandb_run(run_dir: Path) -> dict:
    """What W&B's offline files of a run folder hold: its ids, history rows {step: {key: value}}, config, group, tags,
    and each session's run name in order."""
    runs = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    ids, history, config, group, tags, names = set(), [], {}, set(), set(), []
    for path in runs:
        for r in wandb_records(path):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                ids.add(r.run.run_id)
                group.add(r.run.run_group)
                tags |= set(r.run.tags)
                names.append(r.run.display_name)
                config |= {u.key: json.loads(u.value_json) for u in r.run.config.update}
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                history.append((r.history.step.num, row))
    return {
        "files": runs,
        "ids": ids,
        "history": history,
        "config": config,
        "group": group,
        "tags": tags,
        "names": names,
    }


def metric_steps(history: list[tuple[int, dict]], key: str) -> list[int]:
    return [step for step, row in history if key in row]


def tensors_in(state) -> list[torch.Tensor]:
    """Every tensor in a state (nested dicts, lists and tuples), as a checkpoint holds them."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in tensors_in(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in tensors_in(v)]
    return []


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True, scope="session")
def no_processes_left_behind():
    yield
    left = {pid: _cmdline(pid) for pid in children(os.getpid())}
    # multiprocessing's own resource tracker (started by spawn-context queues) lives until pytest exits
    left = {pid: cmd for pid, cmd in left.items() if "resource_tracker" not in cmd}
    assert not left, f"tests left processes running: {left}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
