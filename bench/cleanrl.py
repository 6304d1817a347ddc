"""CleanRL's own single-file scripts as benchmark peers: each runs unmodified, in a process of its own at the thread
count asked for, and gives its steps/s and its final model's return under rlrun's evaluation.

    .venv/bin/python bench/cleanrl.py dqn --eval "algo=dqn env=cartpole" -- --total-timesteps 20000 --seed 1

The scripts are PyPI's cleanrl==1.2.0 wheel (downloaded by pip into ~/.cache/rlrun-bench, never part of this repo):
cleanrl/dqn.py, ppo.py, ppo_atari.py, sac_continuous_action.py, td3_continuous_action.py. That release is older than
CleanRL's current master: dqn.py is written for gymnasium 0.28; ppo, ppo_atari, sac and td3 for gym 0.23 (`import
gym`, 4-tuple steps); all take argparse flags (`--env-id`, `--total-timesteps`, `--seed`, ...). What is changed, all
before the script starts and none of it inside the script (bench/cleanrl_compat.py has the details):
- `import gym` gets gym 0.23's API over gymnasium 1.x (reset/step signatures, autoreset in the step with
  `terminal_observation`, `TimeLimit.truncated`, `env.seed`, 0.23's RecordEpisodeStatistics/ResizeObservation/
  GrayScaleObservation/FrameStack): the envs are gymnasium's, the same ones rlrun and SB3 step.
- dqn.py's `gymnasium.vector.SyncVectorEnv` autoresets in the same step (SAME_STEP) and names infos as 0.28 did
  (`final_observation`, `final_info` per env): under 1.x's NEXT_STEP default it would store the step after each
  episode's end as a transition.
- `distutils.util.strtobool` is supplied where Python no longer has distutils (3.12 on).
- `torch.set_num_threads(threads)` before the script; `--cuda False`; the script writes its TensorBoard files and
  `runs/` into a temporary folder (its working directory).
Steps/s is the script's own formula (`global_step / (time.time() - start_time)`, start_time set before its loop, so
start-up is left out as rlrun's SPS leaves it out), taken from its globals when it ends rather than from its last `SPS:`
line, which is printed every 100 steps once updates start (none before). The final eval takes the trained networks
from the script's globals after it ends (dqn's greedy Q, SAC's tanh of the mean, TD3's actor, PPO's most likely
action, or samples where eval.deterministic=false) and plays rlrun's evaluation (rlrun.evaluation.Evaluator:
eval.episodes on rlrun's eval envs, its seeds) for the rlrun config `--eval` composes. Needs the bench extra
(stable-baselines3: dqn, sac and td3 use its ReplayBuffer).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VERSION = "1.2.0"
SCRIPTS = ("dqn", "ppo", "ppo_atari", "sac_continuous_action", "td3_continuous_action")
GYM_023 = ("ppo", "ppo_atari", "sac_continuous_action", "td3_continuous_action")  # the rest: gymnasium 0.28
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlrun-bench" / f"cleanrl-{VERSION}"
RESULT = "CLEANRL_RESULT "


@dataclass
class PeerResult:
    sps: float  # the script's own formula, over its training loop
    eval_return: float | None  # mean over rlrun's eval episodes; None without --eval
    steps: int  # env steps at its last SPS line
    seconds: float  # the script's wall time, start-up included


def scripts_dir() -> Path:
    """The folder holding CleanRL's scripts: downloaded once (pip, the wheel alone), then reused."""
    if (CACHE / "cleanrl" / "dqn.py").exists():
        return CACHE
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE.parent) as tmp:
        # The wheel declares python < 3.11 and pins gym 0.23 and SB3 1.2: its scripts are what we want, not its deps.
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--ignore-requires-python"]
        subprocess.run([*pip, f"cleanrl=={VERSION}", "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("cleanrl-*.whl")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(Path(tmp) / "x", [n for n in z.namelist() if n.startswith("cleanrl/")])
        try:
            os.replace(Path(tmp) / "x", CACHE)
        except OSError:  # another process got there first
            pass
    return CACHE


def run(
    script: str,
    args: Sequence[str],
    eval_overrides: Sequence[str] | None = None,
    threads: int = 1,
    timeout: float = 3600,
) -> PeerResult:
    """Run CleanRL's `script` (a name in SCRIPTS) with its command-line `args` in a fresh process; evaluate its final
    model as rlrun evaluates the config that `eval_overrides` (Hydra overrides, e.g. ["algo=sac", "env=pendulum"])
    compose, when given."""
    if script not in SCRIPTS:
        raise ValueError(f"unknown CleanRL script {script!r}; one of {', '.join(SCRIPTS)}")
    spec = {"script": script, "args": list(args), "eval": eval_overrides, "threads": threads}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    scripts_dir()  # downloaded here, not in the timed process
    with tempfile.TemporaryDirectory(prefix="cleanrl-") as cwd:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"CleanRL {script} {shlex.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return PeerResult(**json.loads(lines[-1][len(RESULT) :]))


def _policy(script: str, g: dict[str, Any]) -> Callable[[Any, bool], Any]:
    """act(obs tensor [N, ...], deterministic) -> actions tensor, from the trained script's globals `g`."""
    import torch

    if script == "dqn":
        return lambda x, det: g["q_network"](x).argmax(1)
    if script == "sac_continuous_action":
        return lambda x, det: g["actor"].get_action(x)[2 if det else 0]
    if script == "td3_continuous_action":
        return lambda x, det: g["actor"](x)
    agent = g["agent"]
    features = (lambda x: agent.network(x / 255.0)) if script == "ppo_atari" else (lambda x: x)

    def ppo(x: Any, det: bool) -> Any:
        logits = agent.actor(features(x))
        return logits.argmax(1) if det else torch.distributions.Categorical(logits=logits).sample()

    return ppo


class _Acting:
    """What rlrun's Evaluator asks of an algorithm: act(obs, deterministic, starts) -> actions (numpy)."""

    def __init__(self, act: Callable[[Any, bool], Any]) -> None:
        self.act_tensor = act

    def act(self, obs: np.ndarray, deterministic: bool, starts: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.act_tensor(torch.as_tensor(np.asarray(obs), dtype=torch.float32), deterministic).numpy()


def _evaluate(script: str, g: dict[str, Any], overrides: list[str], threads: int, seed: int) -> float:
    """The mean return of rlrun's final evaluation (eval.episodes, seeded from `seed` as rlrun's run of that seed)."""
    import torch
    from ppo_throughput import rlrun_config

    from rlrun.evaluation import Evaluator

    cfg = rlrun_config(overrides, threads, None, seed)
    evaluator = Evaluator(cfg, torch.device("cpu"))
    try:
        return float(np.mean(evaluator(_Acting(_policy(script, g)))))  # type: ignore[arg-type]
    finally:
        evaluator.close()


def _worker(spec: dict[str, Any]) -> PeerResult:
    import cleanrl_compat
    import torch

    torch.set_num_threads(spec["threads"])
    cleanrl_compat.install_strtobool()
    if spec["script"] in GYM_023:
        cleanrl_compat.install_gym()
    else:
        cleanrl_compat.install_gymnasium_028()
    path = scripts_dir() / "cleanrl" / f"{spec['script']}.py"
    sys.argv = [str(path), "--cuda", "False", *spec["args"]]
    start = time.perf_counter()
    g = runpy.run_path(str(path), run_name="__main__")
    seconds, end = time.perf_counter() - start, time.time()
    # PPO's global_step counts env steps taken; the others' is the index of the last step.
    steps = int(g["global_step"]) + (0 if spec["script"].startswith("ppo") else 1)
    sps = steps / (
        end - g["start_time"]
    )  # the scripts' own SPS formula (steps / time.time() since start_time), at the end
    seed = int(g["args"].seed)
    eval_return = _evaluate(spec["script"], g, spec["eval"], spec["threads"], seed) if spec["eval"] else None
    return PeerResult(sps=sps, eval_return=eval_return, steps=steps, seconds=seconds)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        result = _worker(json.loads(sys.argv[2]))
        print("\n" + RESULT + json.dumps(result.__dict__))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", choices=SCRIPTS)
    parser.add_argument("--eval", default=None, help="rlrun overrides (one string) whose evaluation scores the model")
    parser.add_argument("--threads", type=int, default=1)
    cut = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)  # after it: the script's own flags
    a, args = parser.parse_args(sys.argv[1:cut]), sys.argv[cut + 1 :]
    result = run(a.script, args, shlex.split(a.eval) if a.eval else None, a.threads)
    print(json.dumps(result.__dict__))


if __name__ == "__main__":
    main()
