"""rlrun vs Stable-Baselines3, PPO and A2C: same envs (rlrun's own env builders), same hyperparameters, same step
budget and thread count, one after the other in this process. Prints SPS of each, the ratio, final eval.
SB3 steps its envs in-process (DummyVecEnv, its default); rlrun as its presets say (Breakout: forked workers).
Same numbers do not quite mean the same PPO loss: SB3's value clipping (clip_range_vf) keeps only the clipped
prediction's error where rlrun (as CleanRL) takes the larger of both, and SB3's value loss has no 1/2 factor.
A2C's losses are the same (rlrun's follows SB3's).

    .venv/bin/python bench/ppo_throughput.py [--only cartpole|breakout|a2c-cartpole|a2c-breakout] [--breakout-steps N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlrun.compose.store import register_configs
from rlrun.config import TrainConfig, validate_train
from rlrun.distributed import from_env
from rlrun.envs import make_env
from rlrun.train import train

CONF = str(Path(__file__).resolve().parent.parent / "conf")

# CleanRL ppo.py defaults for CartPole; ppo_atari.py for Breakout.
CASES = {
    "cartpole": dict(
        overrides=[
            "env=cartpole",
            "env.num_envs=4",
            "algo.num_steps=128",
            "algo.num_minibatches=4",
            "algo.update_epochs=4",
            "algo.lr=2.5e-4",
            "algo.gamma=0.99",
            "algo.gae_lambda=0.95",
            "algo.ent_coef=0.01",
            "total_steps=100000",
        ],
        threads=1,
        seeds=8,  # final evals of one seed vary by +-100 for both libraries: compare means over seeds
    ),
    "breakout": dict(
        overrides=["env=breakout", "env.num_envs=8", "eval.episodes=4", "eval.num_envs=4"], threads=2, seeds=2
    ),
    # rl-zoo3's a2c.yml presets (conf/tuned/a2c_*.yaml): CartPole 8 envs x 5 steps; Atari 16 x 5, TF-style RMSprop.
    "a2c-cartpole": dict(overrides=["algo=a2c", "env=cartpole"], threads=1, seeds=2),
    "a2c-breakout": dict(
        overrides=["algo=a2c", "env=breakout", "eval.episodes=4", "eval.num_envs=4"], threads=2, seeds=1
    ),
}


def rlrun_config(overrides: list[str], threads: int, steps: int | None, seed: int = 1) -> TrainConfig:
    register_configs()
    extra = [
        f"seed={seed}",
        f"threads={threads}",
        "eval.every_steps=0",
        "checkpoint.every_steps=0",
        "logging.progress=none",
        "logging.tensorboard=false",
    ] + ([f"total_steps={steps}"] if steps else [])
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = OmegaConf.to_object(compose("train", overrides=overrides + extra))
    validate_train(cfg)
    return cfg


def run_rlrun(cfg: TrainConfig) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as run_dir:
        summary = train(cfg, Path(run_dir), from_env("cpu"), "bench: true\n")
    return summary["sps"], summary["eval_return_mean"]


def run_sb3(cfg: TrainConfig) -> tuple[float, float]:
    return run_sb3_a2c(cfg) if cfg.algo.name == "a2c" else run_sb3_ppo(cfg)


def run_sb3_a2c(cfg: TrainConfig) -> tuple[float, float]:
    from stable_baselines3 import A2C
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
    from stable_baselines3.common.vec_env import DummyVecEnv

    a = cfg.algo
    torch.set_num_threads(cfg.threads)
    env = DummyVecEnv([make_env(cfg.env, train=True) for _ in range(cfg.env.num_envs)])
    cnn = cfg.model.name == "nature_cnn"
    policy_kwargs = {} if cnn else dict(net_arch=dict(pi=cfg.model.hidden_sizes, vf=cfg.model.hidden_sizes))
    if a.optimizer == "rmsprop_tf":
        policy_kwargs |= dict(optimizer_class=RMSpropTFLike, optimizer_kwargs=dict(alpha=a.alpha, eps=a.eps))
    model = A2C(
        "CnnPolicy" if cnn else "MlpPolicy",
        env,
        learning_rate=(lambda f: a.lr * f) if a.anneal_lr else a.lr,
        n_steps=a.num_steps,
        gamma=a.gamma,
        gae_lambda=a.gae_lambda,
        ent_coef=a.ent_coef,
        vf_coef=a.vf_coef,
        max_grad_norm=a.max_grad_norm,
        rms_prop_eps=a.eps,
        use_rms_prop=a.optimizer != "adam",
        normalize_advantage=a.norm_adv,
        policy_kwargs=policy_kwargs,
        seed=cfg.seed,
        device="cpu",
        verbose=0,
    )
    return learn_and_evaluate(model, cfg)


def run_sb3_ppo(cfg: TrainConfig) -> tuple[float, float]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    a = cfg.algo
    torch.set_num_threads(cfg.threads)
    env = DummyVecEnv([make_env(cfg.env, train=True) for _ in range(cfg.env.num_envs)])
    cnn = cfg.model.name == "nature_cnn"
    policy_kwargs = (
        {}
        if cnn
        else dict(net_arch=dict(pi=cfg.model.hidden_sizes, vf=cfg.model.hidden_sizes), activation_fn=torch.nn.Tanh)
    )
    policy_kwargs["optimizer_kwargs"] = dict(eps=a.adam_eps)
    model = PPO(
        "CnnPolicy" if cnn else "MlpPolicy",
        env,
        learning_rate=lambda f: a.lr * f,
        n_steps=a.num_steps,
        batch_size=a.num_steps * cfg.env.num_envs // a.num_minibatches,
        n_epochs=a.update_epochs,
        gamma=a.gamma,
        gae_lambda=a.gae_lambda,
        clip_range=a.clip_coef,
        clip_range_vf=a.clip_coef if a.clip_vloss else None,
        normalize_advantage=a.norm_adv,
        ent_coef=a.ent_coef,
        vf_coef=a.vf_coef,
        max_grad_norm=a.max_grad_norm,
        policy_kwargs=policy_kwargs,
        seed=cfg.seed,
        device="cpu",
        verbose=0,
    )
    return learn_and_evaluate(model, cfg)


def learn_and_evaluate(model, cfg: TrainConfig) -> tuple[float, float]:
    """Train an SB3 model for cfg.total_steps: (SPS, mean deterministic eval return on rlrun's eval envs)."""
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv

    start = time.perf_counter()
    model.learn(total_timesteps=cfg.total_steps)
    sps = model.num_timesteps / (time.perf_counter() - start)
    eval_env = DummyVecEnv([make_env(cfg.env, train=False) for _ in range(min(cfg.eval.num_envs, cfg.eval.episodes))])
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=cfg.eval.episodes, deterministic=cfg.eval.deterministic)
    return sps, float(mean)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=list(CASES))
    parser.add_argument("--breakout-steps", type=int, default=16384)
    args = parser.parse_args()
    rows = []
    for name, case in CASES.items():
        if args.only and name != args.only:
            continue
        steps = args.breakout_steps if name.endswith("breakout") else None
        ours, peer = [], []
        for seed in range(1, case["seeds"] + 1):  # the two libraries alternate, so drift hits both alike
            cfg = rlrun_config(case["overrides"], case["threads"], steps, seed)
            ours.append(run_rlrun(cfg))
            peer.append(run_sb3(cfg))
            print(
                f"{name} seed {seed}: rlrun {ours[-1][0]:.0f} sps (eval {ours[-1][1]:.1f}), "
                f"SB3 {peer[-1][0]:.0f} sps (eval {peer[-1][1]:.1f})",
                flush=True,
            )
        rows.append((name, cfg.total_steps, len(ours), np.array(ours), np.array(peer)))
    print(
        "\n| case | steps | seeds | rlrun SPS (median) | SB3 SPS (median) | ratio | rlrun eval (mean) "
        "| SB3 eval (mean) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, steps, seeds, ours, peer in rows:
        sps, psps = np.median(ours[:, 0]), np.median(peer[:, 0])
        print(
            f"| {name} | {steps} | {seeds} | {sps:.0f} | {psps:.0f} | {sps / psps:.2f}x "
            f"| {ours[:, 1].mean():.1f} | {peer[:, 1].mean():.1f} |"
        )


if __name__ == "__main__":
    main()
