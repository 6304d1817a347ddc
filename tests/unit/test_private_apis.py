"""The private APIs of torch, Hydra, OmegaConf and gymnasium that rlrun uses, all in this one table: where, why, and a
probe of what rlrun relies on. algos/ and models/ use none (the reference is public torch). When an upgrade changes
one, its test fails naming the API, the library's version and where rlrun uses it."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class PrivateApi:
    name: str
    library: str  # the package whose version the failure names
    used_in: str
    why: str
    probe: Callable[[], None]  # raises (or fails an assert) when what rlrun relies on changed


def _fused_adam() -> None:
    """torch._fused_adam_ over one flat buffer steps as torch.optim.Adam(fused=True) does."""
    import torch

    p, g = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.25])
    m, v, step = torch.zeros(2), torch.zeros(2), torch.zeros(())
    step.add_(1)
    kwargs = dict(lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    torch._fused_adam_([p], [g], [m], [v], [], [step], **kwargs)
    ref = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    ref.grad = g.clone()
    torch.optim.Adam([ref], lr=0.1, eps=1e-8, fused=True).step()
    torch.testing.assert_close(p, ref.detach(), rtol=0, atol=0)


def _ddp_ignore() -> None:
    """DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names) marks the names on the module
    (DDP's constructor reads them from there)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    module = torch.nn.Linear(2, 2)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ["bias"])
    assert list(module._ddp_params_and_buffers_to_ignore) == ["bias"]


def _default_store() -> None:
    import torch.distributed as dist

    assert list(inspect.signature(dist.distributed_c10d._get_default_store).parameters) == []


def _dynamo() -> None:
    importlib.import_module("torch._dynamo")


def _hydra_structured_source() -> None:
    from hydra._internal.core_plugins.structured_config_source import StructuredConfigSource
    from hydra._internal.sources_registry import SourcesRegistry

    assert StructuredConfigSource.scheme() == "structured"
    assert isinstance(SourcesRegistry.instance().types, dict)


def _hydra_args_parser() -> None:
    from hydra._internal.utils import get_args_parser

    assert any("--cfg" in a.option_strings for a in get_args_parser()._actions)


def _hydra_run_steps() -> None:
    """What Hydra.run does between composing and returning, which rlrun/compose/hydra_compat.run_composed repeats on a
    config composed already: Callbacks from the config, run_job, and run_and_report around them."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import run_and_report

    run = inspect.getsource(Hydra.run)
    for step in ("configure_log", "Callbacks(cfg)", "on_run_start", "run_job(", 'job_dir_key="hydra.run.dir"'):
        assert step in inspect.getsource(Hydra.compose_config) + run, step
    assert {"on_run_start", "on_run_end", "on_job_start", "on_job_end"} <= set(vars(Callbacks))
    assert run_and_report(lambda: 7) == 7


def _omegaconf_get_node() -> None:
    from omegaconf import IntegerNode, OmegaConf

    @dataclass
    class Schema:
        a: int | None = None

    assert isinstance(OmegaConf.structured(Schema)._get_node("a"), IntegerNode)


def _add_relu() -> None:
    """torch.ops.aten._add_relu_(out, bias) adds a bias row to every row of `out` and applies ReLU in place, with the
    bits addmm's product plus bias and relu_ give."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(64, 48, generator=g), torch.randn(32, 48, generator=g), torch.randn(32, generator=g)
    out = torch.mm(x, w.t())
    torch.ops.aten._add_relu_(out, b)
    assert torch.equal(out, torch.addmm(b, x, w.t()).relu_())


def _ale_env_internals() -> None:
    """AtariEnv._action_set maps an action index to the ALE's action (the minimal set unless full_action_space), and
    _frameskip is an int frame count (AtariPreprocessing reads it too)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make("ALE/Breakout-v5", frameskip=1).unwrapped
    try:
        assert list(env._action_set) == list(env.ale.getMinimalActionSet()) and env._frameskip == 1
        assert env.continuous is False
    finally:
        env.close()


def _gymnasium_add_info() -> None:
    import numpy as np
    from gymnasium.vector import VectorEnv

    assert list(inspect.signature(VectorEnv._add_info).parameters) == ["self", "vector_infos", "env_info", "env_num"]

    class Two:  # as rlrun/envs/sync.py borrows it
        num_envs = 2
        _add_info = VectorEnv._add_info

    out = Two()._add_info({}, {"episode": {"r": 1.5}}, 1)
    np.testing.assert_array_equal(out["_episode"], [False, True])
    assert out["episode"]["r"][1] == 1.5


def _cartpole_counters() -> None:
    """The attributes CartPoleArrays keeps as arrays and writes back: TimeLimit's step count and limit, CartPoleEnv's
    reward variant, counted as their own steps count them."""
    from rlrun.config import EnvConfig
    from rlrun.envs import make_env

    env = make_env(EnvConfig(kwargs={"sutton_barto_reward": True}), train=True)()
    env.reset(seed=0)
    env.step(0)
    limit, cart = env.env, env.unwrapped
    assert (limit._elapsed_steps, limit._max_episode_steps, cart._sutton_barto_reward) == (1, 500, True)
    assert (env.episode_lengths, env.episode_returns, cart.steps_beyond_terminated) == (1, 0.0, None)
    assert limit.env._has_reset  # OrderEnforcing's: CartPole stepped in floats steps an env only once reset


PRIVATE_APIS = [
    PrivateApi(
        "torch._fused_adam_",
        "torch",
        "rlrun/fast/flat_adam.py, rlrun/fast/stacked_adam.py",
        "the kernel behind Adam(fused=True), called on one flat buffer (or a batch's slices) without torch.optim's "
        "per-tensor bookkeeping",
        _fused_adam,
    ),
    PrivateApi(
        "DistributedDataParallel._set_params_and_buffers_to_ignore_for_model",
        "torch",
        "rlrun/ddp.py",
        "DDP's only way to leave out parameters a learner does not train (SAC's critics in the actor's learner)",
        _ddp_ignore,
    ),
    PrivateApi(
        "torch.distributed.distributed_c10d._get_default_store",
        "torch",
        "rlrun/distributed.py",
        "the store the group formed on, for the stragglers' finish line without a second server",
        _default_store,
    ),
    PrivateApi(
        "torch._dynamo (imported ahead)",
        "torch",
        "rlrun/launch.py, rlrun/distributed.py",
        "building DDP imports it (~2 s a rank): once in the launcher before forking; before the group is made",
        _dynamo,
    ),
    PrivateApi(
        "hydra._internal: StructuredConfigSource, SourcesRegistry",
        "hydra-core",
        "rlrun/compose/hydra_compat.py",
        "a structured-config source that reads the ConfigStore live (facebookresearch/hydra#2928)",
        _hydra_structured_source,
    ),
    PrivateApi(
        "hydra._internal.utils.get_args_parser",
        "hydra-core",
        "rlrun/compose/hydra_compat.py",
        "Hydra's own command-line parser, so rlrun's CLI takes exactly Hydra's flags",
        _hydra_args_parser,
    ),
    PrivateApi(
        "hydra._internal: Hydra.run's steps (Callbacks, run_and_report)",
        "hydra-core",
        "rlrun/compose/hydra_compat.py",
        "a single run on the pre-flight's composition, made as Hydra's app makes it, without composing twice more",
        _hydra_run_steps,
    ),
    PrivateApi(
        "DictConfig._get_node",
        "omegaconf",
        "rlrun/compose/hydra_compat.py",
        "a key's node type (IntegerNode) without resolving its value",
        _omegaconf_get_node,
    ),
    PrivateApi(
        "torch.ops.aten._add_relu_",
        "torch",
        "rlrun/fast/continuous_steps.py (BareMLP)",
        "a hidden layer's bias and ReLU in one pass over the product (addmm copies the bias into its output first)",
        _add_relu,
    ),
    PrivateApi(
        "ale_py AtariEnv._action_set, _frameskip",
        "ale-py",
        "rlrun/envs/atari.py (AtariFrames)",
        "an agent step's frames played on the ALE itself, with the actions and frame count AtariEnv.step uses",
        _ale_env_internals,
    ),
    PrivateApi(
        "gymnasium.vector.VectorEnv._add_info",
        "gymnasium",
        "rlrun/envs/sync.py",
        "per-env infos batched exactly as gymnasium's vector envs batch them",
        _gymnasium_add_info,
    ),
    PrivateApi(
        "TimeLimit._elapsed_steps, _max_episode_steps; CartPoleEnv._sutton_barto_reward; OrderEnforcing._has_reset",
        "gymnasium",
        "rlrun/fast/cartpole_arrays.py, cartpole_floats.py",
        "CartPoles stepped as arrays or in floats keep the wrappers' counters and the reward variant as their steps do",
        _cartpole_counters,
    ),
]


@pytest.mark.parametrize("api", PRIVATE_APIS, ids=lambda api: api.name)
def test_private_api_rlrun_relies_on_is_unchanged(api: PrivateApi):
    from importlib.metadata import version

    try:
        api.probe()
    except Exception as e:
        pytest.fail(
            f"{api.name} changed in {api.library} {version(api.library)}: rlrun uses it in {api.used_in} ({api.why}); "
            f"{type(e).__name__}: {e}",
            pytrace=False,
        )


def test_the_reference_uses_no_private_api():
    """algos/ and models/ (what algo.fast=false runs, and what a reader reads) touch no underscored name of another
    object or module: no `torch._x`, no `module._x`, no import from a private module (their own classes' members
    through self or cls are theirs; `_target_` is a field of rlrun's ModelConfig, named as Hydra names it)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "rlrun"
    found = []
    for path in sorted([*root.glob("algos/*.py"), *root.glob("models/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr[:1] == "_" != node.attr[1:2] and node.attr != "_target_":
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and any(p[:1] == "_" != p[1:2] for p in (node.module or "").split(".")):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} from {node.module}")
    assert not found, f"private APIs in the reference: {found}"
