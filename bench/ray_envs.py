"""Env workers in Ray actors (env.vector.backend=ray) against forked workers and tianshou's Ray pattern, as the
efficiency table of tianshou #1172: efficiency = collection SPS / (envs / step duration).

The env is bench/slow_envs.py's ParallelSlowCartPole: CartPole whose step sleeps d, the envs of one process in
parallel (a simulator on cores of its own), so the ideal, envs / d, is measurable beyond this machine's 2 cores and
what is lost is what the backend adds: round trips, acting, assembling the rollout. Each row is PPO's collect
(rollouts of the default MLP policy, as training runs them), timed after one warm-up rollout:

- ray: rlrun's Ray backend, `--workers` actors of envs/workers envs each; every actor runs its rollout segment with
  a copy of the policy (weights through the object store once per rollout) and returns it as one object.
- subproc: rlrun's forked workers, the same split, acting in the workers (one command per rollout).
- tianshou pattern: a small reimplementation of tianshou's RayVectorEnv, for comparison: one env per Ray actor,
  the policy acting in the rank and a ray.get round trip to every actor each step (not tianshou's code).
- sync: every env in the rank, no transport: the ceiling of this env model.

    .venv/bin/python bench/ray_envs.py [--envs 16 64] [--step-s 0.1 0.01 0.001] [--workers 4] [--nodes 1 2]

Each measurement runs in a process of its own (Ray's driver threads and forked workers do not mix); with
--nodes 2 the Ray rows use a two-node cluster on this machine (ray.cluster_utils), actors spread over both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKENDS = ("ray", "subproc", "tianshou pattern", "sync")


def rollout_steps(step_s: float) -> tuple[int, int]:
    """(rollout length, rollouts timed): about a second of stepping per rollout, at least 3 s in all."""
    steps = max(8, min(128, int(round(1.0 / step_s / 8)) * 8))
    return steps, max(2, int(3.0 / (steps * step_s)))


def one(backend: str, num_envs: int, step_s: float, workers: int, address: str | None) -> dict:
    """Collection SPS of one backend, in this process."""
    import torch

    from rlrun.algos.ppo import PPO, PPOConfig
    from rlrun.algos.protocol import EnvSpec
    from rlrun.config import EnvConfig, ModelConfig, VectorConfig
    from rlrun.envs import env_seeds, make_vector_env
    from rlrun.fast import accelerate

    torch.set_num_threads(1)
    os.chdir(HERE)  # slow_envs.py is imported from the working directory, by the rank and the actors alike
    steps, rollouts = rollout_steps(step_s)
    vector = VectorConfig(backend="sync" if backend == "tianshou pattern" else backend, num_workers=workers)
    vector.ray_address = address
    cfg = EnvConfig(
        id="ParallelSlowCartPole-v0", num_envs=num_envs, kwargs={"step_s": step_s}, imports=["slow_envs"], vector=vector
    )
    if backend == "tianshou pattern":
        envs = OneEnvPerActor(cfg, address)
    else:
        envs = make_vector_env(cfg, num_envs)
    try:
        spec = EnvSpec(envs.single_observation_space, envs.single_action_space, num_envs)
        algo = PPO(PPOConfig(num_steps=steps), ModelConfig(), spec, torch.device("cpu"))
        applied = accelerate(algo, envs)
        algo.start(envs.reset(seed=env_seeds(0, 0, num_envs))[0])
        algo.collect(envs)  # warm-up: actors' first calls, lazily made policies
        start = time.perf_counter()
        for _ in range(rollouts):
            algo.collect(envs)
        elapsed = time.perf_counter() - start
    finally:
        envs.close()
    sps = rollouts * steps * num_envs / elapsed
    return {"sps": sps, "efficiency": sps / (num_envs / step_s), "accelerations": applied, "steps": steps}


class OneEnvPerActor:
    """tianshou's RayVectorEnv pattern, reimplemented small: each env in a Ray actor of its own, every step a
    ray.get of all of them. The vector env interface rlrun's collect loop steps (one group, SAME_STEP autoreset)."""

    def __init__(self, cfg, address: str | None):
        import ray

        from rlrun.envs import import_env_modules, make_env

        import_env_modules(cfg.imports)
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        self.ray = ray
        probe = make_env(cfg, True)()
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        probe.close()
        self.num_envs, self.num_workers = cfg.num_envs, cfg.num_envs
        self.groups = [slice(0, cfg.num_envs)]
        actor = ray.remote(num_cpus=0, scheduling_strategy="SPREAD")(OneEnv)
        self.actors = [actor.remote(cfg, os.getcwd()) for _ in range(cfg.num_envs)]
        self.pending: list = []

    def reset(self, seed):
        import numpy as np

        obs = self.ray.get([a.reset.remote(s) for a, s in zip(self.actors, seed)])
        return np.stack(obs), {}

    def send(self, group: int, actions) -> None:
        self.pending = [a.step.remote(x) for a, x in zip(self.actors, actions)]

    def recv(self, group: int):
        import numpy as np

        from rlrun.envs.sync import batch_infos

        obs, rewards, terminated, truncated, infos = zip(*self.ray.get(self.pending))
        return np.stack(obs), np.array(rewards), np.array(terminated), np.array(truncated), batch_infos(list(infos))

    def check_alive(self) -> None: ...

    def close(self) -> None:
        self.ray.shutdown()


class OneEnv:
    """One env in a Ray actor: step with SAME_STEP autoreset, as tianshou's Ray worker steps its env."""

    def __init__(self, cfg, cwd: str):
        os.chdir(cwd)
        sys.path.append(cwd)
        from rlrun.envs import import_env_modules, make_env

        import_env_modules(cfg.imports)
        self.env = make_env(cfg, True)()

    def reset(self, seed: int):
        return self.env.reset(seed=seed)[0]

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = {"final_obs": obs, "final_info": info}
            obs, _ = self.env.reset()
        return obs, reward, terminated, truncated, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--step-s", type=float, nargs="+", default=[0.1, 0.01, 0.001])
    parser.add_argument("--workers", type=int, default=4, help="actors / forked workers (ray, subproc)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2], help="Ray nodes on this machine")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--one", nargs=4, metavar=("BACKEND", "ENVS", "STEP_S", "ADDRESS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        backend, envs, step_s, address = args.one
        print(json.dumps(one(backend, int(envs), float(step_s), args.workers, None if address == "-" else address)))
        return
    print("efficiency = collection SPS / (envs / step duration); PPO's rollouts of the default MLP")
    print(f"{'nodes':>5} {'envs':>5} {'step s':>7} " + " ".join(f"{b:>17}" for b in args.backends))
    for nodes in args.nodes:
        cluster = _cluster(nodes) if nodes > 1 else None
        try:
            for num_envs in args.envs:
                for step_s in args.step_s:
                    cells = []
                    for backend in args.backends:
                        if cluster is None or backend in ("ray", "tianshou pattern"):
                            address = cluster.address if cluster is not None else "-"
                            cells.append(_run(backend, num_envs, step_s, args.workers, address))
                        else:  # sync and forked workers do not use the cluster
                            cells.append("")
                    print(f"{nodes:>5} {num_envs:>5} {step_s:>7g} " + " ".join(f"{c:>17}" for c in cells), flush=True)
        finally:
            if cluster is not None:
                cluster.shutdown()


def _run(backend: str, num_envs: int, step_s: float, workers: int, address: str) -> str:
    cmd = [sys.executable, __file__, "--workers", str(workers), "--one", backend, str(num_envs), str(step_s), address]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    if out.returncode != 0:
        return "failed: " + out.stderr.strip().splitlines()[-1][:60]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return f"{result['efficiency']:.0%} ({result['sps']:.0f})"


def _cluster(nodes: int):
    """`nodes` Ray nodes on this machine, each with as many logical CPUs as the machine has cores."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": os.cpu_count()})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=os.cpu_count())
    cluster.wait_for_nodes()
    return cluster


if __name__ == "__main__":
    main()
