"""The forked env worker pool with real worker processes: same trajectories as the in-process vector env,
inheritance from a spawned parent, and every way a worker can fail surfacing promptly without hangs."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.ppo import PPO, PPOConfig
from rlrun.algos.protocol import EnvSpec
from rlrun.config import AtariConfig, EnvConfig, ModelConfig, VectorConfig
from rlrun.envs import make_env, make_vector_env
from rlrun.envs.pool import EnvWorkerError, EnvWorkerTimeout, WorkerPool
from tests.conftest import Faulty, assert_reaped, cli_env, rlrun

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120), pytest.mark.serial]


def pool_cfg(env_id: str = "CartPole-v1", **vector) -> EnvConfig:
    atari = AtariConfig() if env_id.startswith("ALE/") else None
    return EnvConfig(id=env_id, atari=atari, vector=VectorConfig(backend="subproc", **vector))


@pytest.mark.parametrize("env_id, steps", [("CartPole-v1", 300), ("ALE/Breakout-v5", 120)])
def test_pool_matches_in_process_vector_env(env_id, steps):
    sync = make_vector_env(EnvConfig(id=env_id, atari=pool_cfg(env_id).atari), 4)
    pool = make_vector_env(pool_cfg(env_id, num_workers=2), 4)
    try:
        seeds = [11, 12, 13, 14]
        o1, _ = sync.reset(seed=seeds)
        o2, _ = pool.reset(seed=seeds)
        np.testing.assert_array_equal(o1, o2)
        rng = np.random.default_rng(0)
        finals = 0
        for _ in range(steps):
            actions = rng.integers(0, sync.single_action_space.n, size=4)
            a, b = sync.step(actions), pool.step(actions)
            for x, y in zip(a[:4], b[:4]):
                np.testing.assert_array_equal(x, y)
            if "final_obs" in a[4]:
                finals += 1
                np.testing.assert_array_equal(a[4]["_final_obs"], b[4]["_final_obs"])
                for x, y in zip(a[4]["final_obs"][a[4]["_final_obs"]], b[4]["final_obs"][b[4]["_final_obs"]]):
                    np.testing.assert_array_equal(x, y)
                assert ("episode" in a[4]["final_info"]) == ("episode" in b[4]["final_info"])
                if "episode" in a[4]["final_info"]:
                    np.testing.assert_array_equal(
                        a[4]["final_info"]["episode"]["r"], b[4]["final_info"]["episode"]["r"]
                    )
        assert finals > 0 or env_id.startswith("ALE/")
    finally:
        sync.close()
        pool.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policy")
def test_workers_run_under_sched_batch_so_waking_them_does_not_preempt_the_rank():
    pool = make_vector_env(pool_cfg(num_workers=2), 4)
    try:
        pool.reset(seed=0)  # every worker is in its command loop by now
        assert [os.sched_getscheduler(p.pid) for p in pool.procs] == [os.SCHED_BATCH] * 2
        assert os.sched_getscheduler(0) != os.SCHED_BATCH  # the rank keeps its own policy
    finally:
        pool.close()


def test_double_buffered_collect_keeps_the_rollout_layout():
    """Replaying the recorded actions of a double-buffered rollout in an in-process env reproduces
    every stored observation, reward and flag at its [t, env] place."""
    cfg = pool_cfg(num_workers=2, double_buffer=True)
    pool = make_vector_env(cfg, 4)
    torch.manual_seed(0)
    spec = EnvSpec(pool.single_observation_space, pool.single_action_space, 4)
    algo = PPO(PPOConfig(num_steps=64), ModelConfig(), spec, torch.device("cpu"))
    seeds = [1, 2, 3, 4]
    algo.start(pool.reset(seed=seeds)[0])
    try:
        assert len(pool.groups) == 2
        algo.collect(pool)
    finally:
        pool.close()
    r = algo.rollout
    replay = make_vector_env(EnvConfig(), 4)
    obs, _ = replay.reset(seed=seeds)
    for t in range(64):
        np.testing.assert_array_equal(r.obs[t].numpy(), obs)
        obs, reward, terminated, truncated, *_ = replay.step(r.actions[t].numpy())
        np.testing.assert_array_equal(r.rewards_np[t], reward)
        np.testing.assert_array_equal(r.terminated_np[t], terminated)
        np.testing.assert_array_equal(r.truncated_np[t], truncated)
    np.testing.assert_array_equal(algo.next_obs, obs)
    replay.close()


def faulty_pool(mode: str, bad_env: int = 3, timeout: float = 10.0) -> WorkerPool:
    fns = [(lambda i=i: Faulty(mode if i == bad_env else "ok")) for i in range(4)]
    return WorkerPool(fns, num_workers=2, step_timeout_s=timeout)


def step_until_error(pool: WorkerPool, steps: int = 10, reset: bool = True) -> tuple[Exception, float]:
    if reset:
        pool.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(EnvWorkerError) as info:
        for _ in range(steps):
            pool.step(np.zeros(4, np.int64))
    return info.value, time.monotonic() - start


def test_exception_in_env_names_worker_env_and_traceback():
    pool = faulty_pool("raise")
    err, elapsed = step_until_error(pool)
    text = str(err)
    assert "env worker 1" in text and "env 3" in text and "during step" in text
    assert "ValueError: boom in step" in text and "Traceback" in text
    assert elapsed < 1.0
    assert_reaped(pool)


@pytest.mark.parametrize("how", ["sigkill", "segfault"])
def test_dead_worker_is_detected_with_its_signal(how):
    pool = faulty_pool("segfault" if how == "segfault" else "ok")
    if how == "sigkill":
        pool.reset(seed=0)
        os.kill(pool.procs[0].pid, signal.SIGKILL)
    err, elapsed = step_until_error(pool, reset=how != "sigkill")
    assert ("SIGKILL" if how == "sigkill" else "SIGSEGV") in str(err)
    assert f"env worker {0 if how == 'sigkill' else 1}" in str(err)
    assert elapsed < 3.0
    assert_reaped(pool)


def test_slow_step_times_out_naming_the_worker():
    pool = faulty_pool("hang", timeout=0.5)
    err, elapsed = step_until_error(pool)
    assert isinstance(err, EnvWorkerTimeout) and "env worker 1" in str(err) and "0.5 s" in str(err)
    assert elapsed < 2.0
    assert_reaped(pool)  # the hung worker is killed, not waited on


def test_workers_exit_when_their_rank_is_killed(tmp_path):
    script = (
        "import sys, time\n"
        "from rlrun.config import EnvConfig, VectorConfig\n"
        "from rlrun.envs import make_vector_env\n"
        "pool = make_vector_env(EnvConfig(vector=VectorConfig(backend='subproc', num_workers=2)), 4)\n"
        "pool.reset(seed=0)\n"
        "print(' '.join(str(p.pid) for p in pool.procs), flush=True)\n"
        "time.sleep(60)\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=cli_env())
    try:
        pids = [int(p) for p in rank.stdout.readline().split()]
        assert len(pids) == 2
        rank.kill()
        rank.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.05)
        assert not any(os.path.exists(f"/proc/{p}") for p in pids), "workers outlived their rank"
    finally:
        rank.kill()
        rank.wait(10)


def _spawned_parent(queue) -> None:
    """Runs in a spawned process: defines and registers an env at runtime, then forks the pool."""

    class Counter(gym.Env):
        observation_space = gym.spaces.Box(0, 1e6, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.n = 0
            return np.zeros(1, np.float32), {}

        def step(self, action):
            self.n += 1 + int(action)
            return np.array([self.n], np.float32), 1.0, False, False, {"pid": os.getpid()}

    gym.register("RuntimeCounter-v0", entry_point=Counter)
    pool = make_vector_env(EnvConfig(id="RuntimeCounter-v0", vector=VectorConfig(backend="subproc", num_workers=2)), 2)
    try:
        pool.reset(seed=0)
        obs = None
        for _ in range(3):
            obs, _, _, _, info, _ = pool.step(np.array([0, 1]))
        queue.put((obs.tolist(), sorted(set(info["pid"].tolist())), os.getpid()))
    finally:
        pool.close()


def test_spawned_rank_forks_workers_that_see_its_runtime_registrations():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_spawned_parent, args=(queue,))
    proc.start()
    try:
        result = None
        deadline = time.monotonic() + 60
        while result is None and time.monotonic() < deadline and (proc.is_alive() or not queue.empty()):
            try:
                result = queue.get(timeout=0.5)
            except Exception:
                pass
        assert result is not None, f"spawned parent failed (exit code {proc.exitcode})"
        obs, worker_pids, parent_pid = result
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode == 0
    assert obs == [[3.0], [6.0]]
    assert len(worker_pids) == 2 and parent_pid not in worker_pids


def test_make_env_thunk_works_in_pool_for_breakout_with_double_buffer():
    cfg = pool_cfg("ALE/Breakout-v5", num_workers=2, double_buffer=True)
    pool = WorkerPool([make_env(cfg, True) for _ in range(4)], 2, 30.0, groups=2)
    try:
        obs, _ = pool.reset(seed=1)
        assert obs.shape == (4, 4, 84, 84)
        pool.send(0, np.zeros(2, np.int64))
        pool.send(1, np.ones(2, np.int64))
        for g in (0, 1):
            o, r, te, tr, *_ = pool.recv(g)
            assert o.shape == (2, 4, 84, 84) and r.shape == (2,)
    finally:
        assert_reaped(pool)


def test_training_command_fails_cleanly_when_a_worker_env_raises(tmp_path):
    (tmp_path / "flaky_envs.py").write_text(
        "import gymnasium as gym, numpy as np\n"
        "class Flaky(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)\n"
        "    action_space = gym.spaces.Discrete(2)\n"
        "    t = 0\n"
        "    def reset(self, seed=None, options=None):\n"
        "        return np.zeros(4, np.float32), {}\n"
        "    def step(self, action):\n"
        "        self.t += 1\n"
        "        if self.t == 500:\n"
        "            raise RuntimeError('flaky env gave up')\n"
        "        return np.zeros(4, np.float32), 1.0, self.t % 50 == 0, False, {}\n"
        "gym.register('Flaky-v0', entry_point=Flaky)\n"
    )
    out = rlrun(
        "train",
        "env.id=Flaky-v0",
        "env.imports=[flaky_envs]",
        "env.vector.backend=subproc",
        "env.num_envs=4",
        "total_steps=20000",
        "logging.progress=plain",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode != 0
    assert "RuntimeError: flaky env gave up" in out.stderr and "env worker" in out.stderr
    assert out.stderr.count("RuntimeError: flaky env gave up") == 1  # the worker's traceback, once
    assert "failed" in (tmp_path / "run" / "summary.json").read_text()
