"""What `hydra/launcher=batched` (many seeds in one batched learner, rlrun/seeds.py) trains, checked on the
typed config before anything starts."""

from __future__ import annotations

from rlrun.config import TrainConfig

# The algorithms with a batched learner (rlrun/algos/batched.py registers one for each).
BATCHED_ALGORITHMS = ("ppo", "a2c", "dqn", "sac", "td3")
# The ones whose networks are actor-critics, where model.shared=true would share one trunk between actor and critic.
ACTOR_CRITICS = ("ppo", "a2c")
SUPPORTED = (
    "PPO and A2C with model=mlp (model.shared=false) on Discrete or Box actions, DQN with model=mlp, SAC and TD3; "
    "one rank, env.vector.backend=sync"
)
LAUNCHER = "hydra/launcher=batched"


def batch_refusal(cfg: TrainConfig) -> str | None:
    """The line that refuses a run of `cfg` in a batch of seeds, naming what a batch trains; None when it can train
    in one. (The action space and the observations, which need the env, are checked when the batch builds the
    seeds: image observations, say, give model=mlp a CNN.)"""
    d, m, name = cfg.distributed, cfg.model, cfg.algo.name
    mlp = m._target_ is None and m.name == "mlp"
    reasons = {
        f"algo={name}": name not in BATCHED_ALGORITHMS,
        "a user network (model._target_)": m._target_ is not None,
        f"model={m.name}": m._target_ is None and m.name != "mlp",
        "model.shared=true": mlp and m.shared and name in ACTOR_CRITICS,
        "several ranks": d.nproc_per_node * d.nnodes > 1,
        f"env.vector.backend={cfg.env.vector.backend}": cfg.env.vector.backend != "sync",
        # resume=auto continues each seed from its own folder's newest checkpoint (`rlrun train resume=SWEEP` is that)
        "resume=PATH": cfg.resume not in (None, "auto"),
    }
    refused = [reason for reason, applies in reasons.items() if applies]
    if not refused:
        return None
    hint = "; a batch continues with rlrun train resume=SWEEP_FOLDER" if "resume=PATH" in refused else ""
    return f"{LAUNCHER} trains {SUPPORTED}; not {', '.join(refused)} (run those without it{hint})"
