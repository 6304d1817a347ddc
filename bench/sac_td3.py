"""rlrun SAC and TD3 vs Stable-Baselines3's on Pendulum-v1 and HalfCheetah-v5: same env builder, hyperparameters
(rlrun's presets, conf/tuned/{sac,td3}_*.yaml, which follow rl-zoo3's), step budget and thread count, the two
libraries alternating in this process. Prints SPS, the ratio and the final deterministic eval of each.

The losses are SB3's (the critics' 1/2 for SAC, log alpha in the temperature loss, Q1 for TD3's actor), so equal
numbers mean the same algorithm; SB3's SAC actor has separate mean and log-std output layers where rlrun's has one
of twice the width (the same function class and initialization distribution).

    .venv/bin/python bench/sac_td3.py [--only sac-pendulum|td3-pendulum|sac-halfcheetah|td3-halfcheetah]
        [--steps N] [--seeds 1 2] [--threads 1]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from ppo_throughput import learn_and_evaluate, rlrun_config, run_rlrun

from rlrun.config import TrainConfig
from rlrun.envs import make_env

CASES = {
    "sac-pendulum": (["algo=sac", "env=pendulum"], 20_000),
    "td3-pendulum": (["algo=td3", "env=pendulum"], 20_000),
    "sac-halfcheetah": (["algo=sac", "env=halfcheetah"], 20_000),
    "td3-halfcheetah": (["algo=td3", "env=halfcheetah"], 20_000),
}


def run_sb3(cfg: TrainConfig) -> tuple[float, float]:
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import DummyVecEnv

    a = cfg.algo
    torch.set_num_threads(cfg.threads)
    env = DummyVecEnv([make_env(cfg.env, train=True) for _ in range(cfg.env.num_envs)])
    common = dict(
        learning_rate=a.lr,
        buffer_size=a.buffer_size,
        learning_starts=a.learning_starts,
        batch_size=a.batch_size,
        tau=a.tau,
        gamma=a.gamma,
        train_freq=a.train_freq,
        gradient_steps=a.gradient_steps,
        policy_kwargs=dict(net_arch=list(cfg.model.hidden_sizes), activation_fn=torch.nn.ReLU),
        seed=cfg.seed,
        device="cpu",
        verbose=0,
    )
    if a.name == "sac":
        model = SAC("MlpPolicy", env, ent_coef=f"auto_{a.alpha}" if a.autotune else a.alpha, **common)
    else:
        dim = env.action_space.shape[0]
        # SB3 adds the noise to actions in [-1, 1] as rlrun does: std exploration_noise in both.
        noise = NormalActionNoise(np.zeros(dim), a.exploration_noise * np.ones(dim))
        model = TD3(
            "MlpPolicy",
            env,
            action_noise=noise,
            policy_delay=a.policy_delay,
            target_policy_noise=a.target_policy_noise,
            target_noise_clip=a.target_noise_clip,
            **common,
        )
    return learn_and_evaluate(model, cfg)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=list(CASES))
    parser.add_argument("--steps", type=int, default=None, help="instead of each case's budget")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for name, (overrides, steps) in CASES.items():
        if args.only and name != args.only:
            continue
        for seed in args.seeds:
            cfg = rlrun_config(overrides, args.threads, args.steps or steps, seed)
            ours, peer = run_rlrun(cfg), run_sb3(cfg)
            rows.append((name, seed, ours, peer))
            ours_text, peer_text = f"{ours[0]:.0f} sps (eval {ours[1]:.1f})", f"{peer[0]:.0f} sps (eval {peer[1]:.1f})"
            print(f"{name} seed {seed}: rlrun {ours_text}, SB3 {peer_text}")
    print(f"\n| case | seed | rlrun SPS | SB3 SPS | ratio | rlrun eval | SB3 eval |  ({args.threads} thread(s))")
    print("|---|---|---|---|---|---|---|")
    for name, seed, (sps, ev), (psps, pev) in rows:
        print(f"| {name} | {seed} | {sps:.0f} | {psps:.0f} | {sps / psps:.2f}x | {ev:.1f} | {pev:.1f} |")


if __name__ == "__main__":
    main()
