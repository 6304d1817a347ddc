"""What `hydra/launcher=batched` (many seeds in one batched learner, rlrun/seeds.py) trains, checked on the
typed config before anything starts."""

from __future__ import annotations

from rlrun.config import TrainConfig

SUPPORTED = "PPO with model=mlp (model.shared=false) on Discrete or Box actions, one rank, env.vector.backend=sync"
LAUNCHER = "hydra/launcher=batched"


def batch_refusal(cfg: TrainConfig) -> str | None:
    """The line that refuses a run of `cfg` in a batch of seeds, naming what a batch trains; None when it can train
    in one. (The action space, which needs the env, is checked when the batch builds the seeds.)"""
    d, m = cfg.distributed, cfg.model
    reasons = {
        f"algo={cfg.algo.name}": cfg.algo.name != "ppo",
        "a user network (model._target_)": m._target_ is not None,
        f"model={m.name}": m._target_ is None and m.name != "mlp",
        "model.shared=true": m._target_ is None and m.name == "mlp" and m.shared,
        "several ranks": d.nproc_per_node * d.nnodes > 1,
        f"env.vector.backend={cfg.env.vector.backend}": cfg.env.vector.backend != "sync",
        # resume=auto continues each seed from its own folder's newest checkpoint (`rlrun train resume=SWEEP` is that)
        "resume=PATH": cfg.resume not in (None, "auto"),
    }
    refused = [name for name, applies in reasons.items() if applies]
    if not refused:
        return None
    hint = "; a batch continues with rlrun train resume=SWEEP_FOLDER" if "resume=PATH" in refused else ""
    return f"{LAUNCHER} trains {SUPPORTED}; not {', '.join(refused)} (run those without it{hint})"
