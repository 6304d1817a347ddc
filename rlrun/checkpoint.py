"""Checkpoints: one plain-data file per save (loadable with torch.load(weights_only=True)), written
atomically, the last K kept; loading turns every way a file can be wrong into one clear UserError."""

from __future__ import annotations

import contextlib
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
import yaml

from rlrun.errors import NonFiniteError, UserError
from rlrun.run_folder import checkpoint_name, list_checkpoints, resolve_checkpoint, writing

FORMAT_VERSION = 3  # 3: optimizer state in torch.optim.Adam's format; 2: FlatAdam's flat buffers (upgraded on load)


class Checkpointer:
    """Saves into run_dir/checkpoints. Only the main rank builds one; the others get NullCheckpointer."""

    def __init__(self, directory: Path, keep_last: int):
        self.directory = directory
        self.keep_last = keep_last

    def save(self, state: dict[str, Any], env_steps: int) -> Path:
        # A checkpoint is what a run continues from: never one that cannot train.
        if not all_finite(state.get("algo", state)):
            raise NonFiniteError(
                f"refusing to save a checkpoint at {env_steps:,} env steps: it holds non-finite values"
            )
        path = self.directory / checkpoint_name(env_steps)
        _save_atomic({"rlrun_format": FORMAT_VERSION, "env_steps": env_steps, **state}, path)
        for old in list_checkpoints(self.directory)[: -self.keep_last]:
            old.unlink()
        return path


def all_finite(state: object) -> bool:
    """Whether every floating-point tensor in `state` (nested dicts and lists) is free of NaN and infinity."""
    if isinstance(state, torch.Tensor):
        return not state.is_floating_point() or bool(torch.isfinite(state).all())
    if isinstance(state, dict):
        return all(all_finite(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(all_finite(v) for v in state)
    return True


def _save_atomic(obj: dict[str, Any], path: Path) -> None:
    """Write-then-rename: a crash mid-write leaves the previous checkpoints intact and no torn file. A failed write
    (a full disk) is a Fault naming `path`, and its partial file is removed."""
    tmp = path.with_suffix(".tmp")
    with writing(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:  # a second Ctrl-C mid-write too
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        # The rename lives in the directory: without syncing it, a power loss can undo it.
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def rng_devices(device: torch.device) -> list[torch.device]:
    """The accelerator generators besides the CPU's that this rank draws from (PPO samples on its device)."""
    return [device] if device.type == "cuda" else []


def rng_state(device: torch.device) -> dict[str, Any]:
    """This rank's generator states: the CPU's, and its device's (a resumed GPU run must not replay its noise)."""
    return {"rng": torch.get_rng_state(), "device_rng": [torch.cuda.get_rng_state(d) for d in rng_devices(device)]}


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["rng"])
    saved = state.get("device_rng", [])  # checkpoints of CPU runs have none; a CPU run ignores a GPU run's
    for d, s in zip(rng_devices(device), saved):
        torch.cuda.set_rng_state(s, d)


def _shard_path(directory: Path, env_steps: int, rank: int) -> Path:
    return directory / f"shard_{env_steps:012d}_rank{rank}.pt"


def save_shard(directory: Path, env_steps: int, rank: int, state: dict[str, Any], keep_last: int) -> None:
    """A rank's own large state (its replay shard) beside the checkpoint of the same step; the rank keeps
    its last `keep_last`, as the main rank does for checkpoints."""
    _save_atomic(state, _shard_path(directory, env_steps, rank))
    for old in sorted(directory.glob(f"shard_*_rank{rank}.pt"))[:-keep_last]:
        old.unlink()


def load_shard(checkpoint: Path, env_steps: int, rank: int) -> dict[str, Any] | None:
    """The shard `rank` saved beside `checkpoint` (saved at `env_steps`), or None if it saved none."""
    path = _shard_path(checkpoint.parent, env_steps, rank)
    return _load_data(path, "replay shard") if path.exists() else None


def _load_data(path: Path, kind: str) -> Any:  # the plain data torch.load read
    """torch.load of plain data only; every way the file can be wrong becomes one UserError naming `kind`."""
    unreadable = f"{path} is not a readable {kind} (corrupt, truncated or not a checkpoint file)"
    # torch.save writes zip archives. Anything else torch.load reads as its legacy format, a raw pickle stream, whose
    # opcodes a text file or random bytes can spell: "hello" is a memo lookup that ends in KeyError: 101.
    if path.is_file() and not zipfile.is_zipfile(path):
        raise UserError(unreadable)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # weights_only met a class or function: loading would run code
            raise UserError(f"{path} holds objects other than plain data; refusing to load it") from e
        raise UserError(unreadable) from e
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError) as e:
        raise UserError(unreadable) from e


class NullCheckpointer:
    def save(self, state: dict[str, Any], env_steps: int) -> None:
        return None


def _upgrade_from_2(state: dict[str, Any]) -> None:
    """Format 2 kept Adam's moments as flat buffers over the model's parameters, in the model's state_dict order
    (the models keep no buffers); format 3 has torch.optim.Adam's per-parameter state. Its runs also meant two
    things the config now says otherwise: DQN trained with the Huber loss (algo.loss did not exist, and its
    default is now mse), and an ALE game's env.max_episode_steps counted emulator frames (now agent steps)."""
    optimizer, model = state["algo"]["optimizer"], state["algo"]["model"]
    shapes = [t.shape for t in model.values()]
    step = torch.tensor(float(optimizer["steps"]))
    moments = [optimizer[k].split([s.numel() for s in shapes]) for k in ("exp_avg", "exp_avg_sq")]
    per_param = {
        i: {"step": step.clone(), "exp_avg": m.view(s).clone(), "exp_avg_sq": v.view(s).clone()}
        for i, (m, v, s) in enumerate(zip(*moments, shapes))
    }
    config = yaml.safe_load(state["config"])
    algo, env = config["algo"], config["env"]
    if algo["name"] == "dqn":
        algo.setdefault("loss", "huber")
    if env.get("max_episode_steps") and (env.get("atari") or env["id"].startswith("ALE/")):
        frame_skip = (env.get("atari") or {}).get("frame_skip", 4)
        env["max_episode_steps"] = -(-env["max_episode_steps"] // frame_skip)
    state["config"] = yaml.safe_dump(config, sort_keys=False)
    group = {"lr": float(algo["lr"]), "betas": (0.9, 0.999), "eps": float(algo["adam_eps"])}
    group |= {"weight_decay": 0.0, "amsgrad": False, "maximize": False, "params": list(range(len(shapes)))}
    state["algo"]["optimizer"] = {"state": per_param, "param_groups": [group]}
    state["rlrun_format"] = 3


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and check an rlrun checkpoint. Plain data only: a file that would run code is refused."""
    p = resolve_checkpoint(path)
    state = _load_data(p, "checkpoint")
    if not isinstance(state, dict) or "rlrun_format" not in state:
        raise UserError(f"{p} is not an rlrun checkpoint (no format version in it)")
    if state["rlrun_format"] == 2:
        _upgrade_from_2(state)
    if state["rlrun_format"] != FORMAT_VERSION:
        raise UserError(
            f"{p} has checkpoint format version {state['rlrun_format']}; this rlrun reads version {FORMAT_VERSION}"
        )
    state["path"] = str(p)  # where it was read from (a rank finds its replay shard beside it)
    return state
