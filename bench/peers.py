"""rlrun against CleanRL's scripts and Stable-Baselines3, case after case in one invocation: each case's settings are
one rlrun config, and its peers run the same settings (their flags and arguments are derived from it, and a setting a
peer cannot express is refused). Seeds alternate the libraries, so drift hits all alike. Prints steps/s (median over
seeds), rlrun's ratio to each peer, and the final evals (rlrun's evaluation for all: bench/cleanrl.py).

    .venv/bin/python bench/peers.py [--only dqn-cartpole sac-pendulum ...] [--seeds 1 2 3] [--steps N]
        [--peers cleanrl sb3]

A case is a row of CASES: rlrun's overrides, and for each peer a function from the composed config to its run.
SB3's DQN has no MSE loss (its Huber runs away on CartPole's rewards): DQN's row has CleanRL alone; PPO's rows too
(bench/ppo_throughput.py has rlrun's PPO against SB3's).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import cleanrl
import numpy as np
from ppo_throughput import rlrun_config, run_rlrun
from sac_td3 import run_sb3 as sb3_sac_td3

from rlrun.config import TrainConfig

# (the case's config, the overrides that composed it) -> (steps/s, final eval return)
Run = Callable[[TrainConfig, list[str]], tuple[float, float]]


def _require(cfg: TrainConfig, peer: str, **settings: object) -> None:
    """A setting the peer cannot change must be the config's (else the run would not be the same algorithm)."""
    for path, wanted in settings.items():
        value: object = cfg
        for key in path.split("__"):
            value = getattr(value, key)
        if value != wanted:
            raise SystemExit(f"{peer} runs only {path.replace('__', '.')}={wanted} (the case has {value})")


def _cleanrl(script: str, flags: Callable[[TrainConfig], dict[str, object]]) -> Run:
    def run(cfg: TrainConfig, overrides: list[str]) -> tuple[float, float]:
        args = {"env-id": cfg.env.id, "total-timesteps": cfg.total_steps, "seed": cfg.seed, **flags(cfg)}
        argv = [str(x) for k, v in args.items() for x in (f"--{k}", v)]
        result = cleanrl.run(script, argv, overrides, cfg.threads)
        return result.sps, float(result.eval_return or np.nan)

    return run


def dqn_flags(cfg: TrainConfig) -> dict[str, object]:
    """dqn.py: one env, one 1-step non-double update every train_frequency steps, MSE, no clipping, 120x84 ReLU."""
    a = cfg.algo
    _require(
        cfg,
        "CleanRL's dqn.py",
        env__num_envs=1,
        algo__gradient_steps=1,
        algo__n_step=1,
        algo__double_q=False,
        algo__dueling=False,
        algo__loss="mse",
        model__hidden_sizes=[120, 84],
        model__activation="relu",
    )
    return _replay_flags(cfg) | {
        "learning-rate": a.lr,
        "target-network-frequency": a.target_update_interval * a.train_freq,  # in env steps there
        "start-e": a.start_e,
        "end-e": a.end_e,
        "exploration-fraction": a.exploration_fraction,
        "train-frequency": a.train_freq,
    }


def _replay_flags(cfg: TrainConfig) -> dict[str, object]:
    """The replay's settings, named alike in CleanRL's dqn, sac and td3 scripts."""
    a = cfg.algo
    return {
        "buffer-size": a.buffer_size,
        "gamma": a.gamma,
        "tau": a.tau,
        "batch-size": a.batch_size,
        "learning-starts": a.learning_starts,
    }


def _continuous(cfg: TrainConfig, script: str) -> dict[str, object]:
    _require(
        cfg,
        script,
        env__num_envs=1,
        algo__train_freq=1,
        algo__gradient_steps=1,
        algo__n_step=1,
        model__hidden_sizes=[256, 256],
        model__activation="relu",
    )
    return _replay_flags(cfg)


def sac_flags(cfg: TrainConfig) -> dict[str, object]:
    """sac_continuous_action.py: one learning rate for actor, critics and temperature (its two flags, set alike);
    autotune starts the temperature at 1 and aims at -|A|."""
    a = cfg.algo
    if a.autotune:
        _require(cfg, "CleanRL's SAC", algo__alpha=1.0, algo__target_entropy=None)
    return _continuous(cfg, "CleanRL's SAC") | {
        "policy-lr": a.lr,
        "q-lr": a.lr,
        "policy-frequency": a.policy_frequency,
        "target-network-frequency": a.target_update_interval,
        "alpha": a.alpha,
        "autotune": a.autotune,
    }


def td3_flags(cfg: TrainConfig) -> dict[str, object]:
    """td3_continuous_action.py: noise in units of half the action range, as rlrun's."""
    a = cfg.algo
    return _continuous(cfg, "CleanRL's TD3") | {
        "learning-rate": a.lr,
        "policy-noise": a.target_policy_noise,
        "exploration-noise": a.exploration_noise,
        "noise-clip": a.target_noise_clip,
        "policy-frequency": a.policy_delay,
    }


def ppo_flags(cfg: TrainConfig) -> dict[str, object]:
    """ppo.py (separate 64x64 tanh actor and critic) and ppo_atari.py (the Nature CNN, one trunk): CleanRL's PPO, whose
    Adam epsilon is 1e-5, with GAE and without observation or reward normalization. ppo_atari.py does its own
    preprocessing (SB3's Atari wrappers) on a frameskip-1 game: the v4 NoFrameskip id of the case's ALE game."""
    a, atari = cfg.algo, cfg.env.atari is not None
    cnn = {"model__name": "nature_cnn", "model__hidden_sizes": [512], "model__shared": True}
    mlp = {"model__name": "mlp", "model__hidden_sizes": [64, 64], "model__activation": "tanh", "model__shared": False}
    plain = {"algo__adam_eps": 1e-5, "algo__normalize_obs": False, "algo__normalize_reward": False}
    _require(cfg, "CleanRL's PPO", **plain, **(cnn if atari else mlp))
    flags: dict[str, object] = {
        "learning-rate": a.lr,
        "num-envs": cfg.env.num_envs,
        "num-steps": a.num_steps,
        "anneal-lr": a.anneal_lr,
        "gamma": a.gamma,
        "gae-lambda": a.gae_lambda,
        "num-minibatches": a.num_minibatches,
        "update-epochs": a.update_epochs,
        "norm-adv": a.norm_adv,
        "clip-coef": a.clip_coef,
        "clip-vloss": a.clip_vloss,
        "ent-coef": a.ent_coef,
        "vf-coef": a.vf_coef,
        "max-grad-norm": a.max_grad_norm,
    }
    if a.target_kl is not None:
        flags["target-kl"] = a.target_kl
    if atari:
        game = cfg.env.id.removeprefix("ALE/").removesuffix("-v5")
        flags["env-id"] = f"{game}NoFrameskip-v4"
    return flags


@dataclass(frozen=True)
class Case:
    overrides: list[str]  # rlrun's; the peers' final models are evaluated under the same config
    peers: dict[str, Run] = field(default_factory=dict)  # peer name -> its run of the composed config
    threads: int = 1


# CleanRL dqn.py's own settings (its defaults) for 50k steps instead of 500k; its target sync every 500 env steps.
DQN_CLEANRL = [
    "algo=dqn", "total_steps=50000", "algo.lr=2.5e-4", "algo.buffer_size=10000", "algo.learning_starts=10000",
    "algo.batch_size=128", "algo.n_step=1", "algo.double_q=false", "algo.train_freq=10", "algo.gradient_steps=1",
    "algo.target_update_interval=50", "algo.tau=1.0", "algo.start_e=1.0", "algo.end_e=0.05",
    "algo.exploration_fraction=0.5", "algo.max_grad_norm=1000", "env.num_envs=1", "model.hidden_sizes=[120,84]",
    "model.activation=relu", "eval.episodes=10",
]  # fmt: skip


def _sb3(run: Callable[[TrainConfig], tuple[float, float]]) -> Run:
    return lambda cfg, overrides: run(cfg)


# CleanRL ppo.py's defaults (CartPole; rlrun's env.vector.backend=auto: sync at 4 envs) for 100k steps, and
# ppo_atari.py's (Breakout: rlrun's env=breakout and its preset are CleanRL's) for 20k steps, on 2 threads.
PPO_CLEANRL = [
    "env=cartpole", "env.num_envs=4", "env.vector.backend=auto", "algo.num_steps=128", "algo.num_minibatches=4",
    "algo.update_epochs=4", "algo.lr=2.5e-4", "algo.gamma=0.99", "algo.gae_lambda=0.95", "algo.ent_coef=0.01",
    "total_steps=100000",
]  # fmt: skip
PPO_ATARI_CLEANRL = ["env=breakout", "env.num_envs=8", "total_steps=20480", "eval.episodes=4", "eval.num_envs=4"]
SAC = {"cleanrl": _cleanrl("sac_continuous_action", sac_flags), "sb3": _sb3(sb3_sac_td3)}
TD3 = {"cleanrl": _cleanrl("td3_continuous_action", td3_flags), "sb3": _sb3(sb3_sac_td3)}
# SAC's and TD3's presets (conf/tuned/), 20k steps; TD3 on HalfCheetah with 256x256 networks (CleanRL's fixed size).
CASES: dict[str, Case] = {
    "ppo-cartpole": Case(PPO_CLEANRL, {"cleanrl": _cleanrl("ppo", ppo_flags)}),
    "ppo-breakout": Case(PPO_ATARI_CLEANRL, {"cleanrl": _cleanrl("ppo_atari", ppo_flags)}, threads=2),
    "dqn-cartpole": Case(DQN_CLEANRL, {"cleanrl": _cleanrl("dqn", dqn_flags)}),
    "sac-pendulum": Case(["algo=sac", "env=pendulum", "total_steps=20000"], SAC),
    "td3-pendulum": Case(["algo=td3", "env=pendulum", "total_steps=20000"], TD3),
    "sac-halfcheetah": Case(["algo=sac", "env=halfcheetah", "total_steps=20000"], SAC),
    "td3-halfcheetah": Case(["algo=td3", "env=halfcheetah", "total_steps=20000", "model.hidden_sizes=[256,256]"], TD3),
}
PEERS = ("cleanrl", "sb3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(CASES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="total_steps for every case instead of its own")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    rows = []
    for name, case in CASES.items():
        if args.only and name not in args.only:
            continue
        peers = {p: run for p, run in case.peers.items() if p in args.peers}
        results: dict[str, list[tuple[float, float]]] = {"rlrun": [], **{p: [] for p in peers}}
        for seed in args.seeds:
            overrides = case.overrides + ([f"total_steps={args.steps}"] if args.steps else [])
            cfg = rlrun_config(overrides, case.threads, args.steps, seed)
            line = []
            for who, run in {"rlrun": lambda cfg, _: run_rlrun(cfg), **peers}.items():
                results[who].append(run(cfg, overrides))
                line.append(f"{who} {results[who][-1][0]:.0f} sps (eval {results[who][-1][1]:.1f})")
            print(f"{name} seed {seed}: " + ", ".join(line), flush=True)
        rows.append((name, cfg.total_steps, {k: np.array(v) for k, v in results.items()}))
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    print_table(rows, args.peers, len(args.seeds))


def print_table(rows: list[tuple[str, int, dict[str, np.ndarray]]], peers: list[str], seeds: int) -> None:
    heads = "".join(f" {p} SPS | rlrun / {p} |" for p in peers)
    evals = "".join(f" {p} eval |" for p in peers)
    print(f"\n| case | steps | rlrun SPS |{heads} rlrun eval |{evals}  (median SPS, eval mean +- std, {seeds} seeds)")
    print("|---" * (4 + 3 * len(peers)) + "|")
    for name, steps, r in rows:
        ours = np.median(r["rlrun"][:, 0])
        cells = [f"{name} | {steps} | {ours:.0f}"]
        for p in peers:
            cells.append(f"{np.median(r[p][:, 0]):.0f} | {ours / np.median(r[p][:, 0]):.2f}x" if p in r else "- | -")
        cells.append(_eval(r["rlrun"]))
        cells += [_eval(r[p]) if p in r else "-" for p in peers]
        print("| " + " | ".join(cells) + " |")


def _eval(results: np.ndarray) -> str:
    return f"{results[:, 1].mean():.1f} +- {results[:, 1].std():.1f}"


if __name__ == "__main__":
    main()
