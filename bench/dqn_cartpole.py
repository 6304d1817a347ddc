"""rlrun DQN vs Stable-Baselines3 DQN on CartPole-v1: same env builder, hyperparameters (rl-zoo3's dqn.yml for
CartPole-v1: what SB3 can express; rlrun's tuned file differs), step budget and thread count, one after the other
in this process. SB3's DQN is 1-step and not double, so rlrun runs so here. Prints SPS, ratio, final eval returns.

    .venv/bin/python bench/dqn_cartpole.py [--seeds 1 2 3] [--steps N]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from ppo_throughput import learn_and_evaluate, rlrun_config, run_rlrun

from rlrun.config import TrainConfig
from rlrun.envs import make_env

RL_ZOO = [
    "algo.double_q=false",
    "algo.n_step=1",
    "algo.lr=2.3e-3",
    "algo.tau=1.0",
    "algo.target_update_interval=128",  # a copy before each training phase of 128 updates
    "model.hidden_sizes=[256,256]",
]


def run_sb3(cfg: TrainConfig) -> tuple[float, float]:
    from stable_baselines3 import DQN
    from stable_baselines3.common.vec_env import DummyVecEnv

    a, n = cfg.algo, cfg.env.num_envs
    torch.set_num_threads(cfg.threads)
    env = DummyVecEnv([make_env(cfg.env, train=True) for _ in range(n)])
    model = DQN(
        "MlpPolicy",
        env,
        learning_rate=a.lr,
        buffer_size=a.buffer_size,
        learning_starts=a.learning_starts,
        batch_size=a.batch_size,
        gamma=a.gamma,
        train_freq=a.train_freq,
        gradient_steps=a.gradient_steps,
        # SB3 counts the interval in env steps during collection; a sync every training phase is rlrun's
        # target_update_interval = gradient_steps.
        target_update_interval=a.train_freq * n if a.target_update_interval == a.gradient_steps else 10**9,
        exploration_fraction=a.exploration_fraction,
        exploration_initial_eps=a.start_e,
        exploration_final_eps=a.end_e,
        max_grad_norm=a.max_grad_norm,
        policy_kwargs=dict(net_arch=cfg.model.hidden_sizes, activation_fn=torch.nn.ReLU),
        seed=cfg.seed,
        device="cpu",
        verbose=0,
    )
    return learn_and_evaluate(model, cfg)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        cfg = rlrun_config(["algo=dqn", *RL_ZOO, f"seed={seed}"], 1, args.steps)
        ours, peer = run_rlrun(cfg), run_sb3(cfg)
        rows.append((seed, ours, peer))
        print(f"seed {seed}: rlrun {ours[0]:.0f} sps (eval {ours[1]:.1f}), SB3 {peer[0]:.0f} sps (eval {peer[1]:.1f})")
    print("\n| seed | rlrun SPS | SB3 SPS | ratio | rlrun eval | SB3 eval |")
    print("|---|---|---|---|---|---|")
    for seed, (sps, ev), (psps, pev) in rows:
        print(f"| {seed} | {sps:.0f} | {psps:.0f} | {sps / psps:.2f}x | {ev:.1f} | {pev:.1f} |")
    ratios = [o[0] / p[0] for _, o, p in rows]
    print(f"median SPS ratio {np.median(ratios):.2f}x over {len(rows)} seed(s)")


if __name__ == "__main__":
    main()
