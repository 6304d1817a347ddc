"""The per-seed pieces of the batched learners (many seeds in one process, issue 35), whatever the algorithm: where a
seed's own parameters lie in the stacked ones [S, ...] (Tie), S seeds' MLPs as one network (StackedMLP), gradient-norm
clipping by each seed's own norm, each seed's own optimizer stepping its slices of the stack (SeedSteps) and seen in
its single run's format (SeedOptimizer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from rlrun.algos.finite import nonfinite_error
from rlrun.algos.off_policy import polyak_update
from rlrun.algos.parts import MakeOptimizer
from rlrun.algos.returns import compute_gae
from rlrun.errors import NonFiniteError
from rlrun.models.encoders import ACTIVATIONS

# How a seed's own parameter maps onto its slice of a stacked one: (the stacked parameter's name, the seed's parameter
# in its ActorCritic (nn.Module.get_parameter's path), the view of a tensor of that parameter's shape laid out as the
# slice).
Layout = tuple[str, str, Callable[[Tensor], Tensor]]


def transposed(t: Tensor) -> Tensor:
    return t.T


def row(t: Tensor) -> Tensor:
    return t[None]


def same(t: Tensor) -> Tensor:
    return t


@dataclass(frozen=True)
class Tie:
    """One of a seed's own parameters (its single-run network's) and where it lies in a stacked one: the slice
    stacked[seed][index] holds view(own), the own tensor laid out as the slice (a Linear's weight transposed, a bias
    as a row)."""

    stacked: Tensor  # [S, ...]
    seed: int
    own: Tensor
    view: Callable[[Tensor], Tensor] = same
    index: tuple[Any, ...] = ()

    def of(self, t: Tensor) -> Tensor:
        """The seed's slice of `t`, a tensor shaped as `stacked` (the parameter, or an optimizer's moment of it)."""
        return t[self.seed][self.index]


@torch.no_grad()
def take_own(ties: Sequence[Tie]) -> None:
    """Stacked slices <- the seeds' own parameters (at the start, and after checkpoints were loaded into them)."""
    for tie in ties:
        tie.of(tie.stacked).copy_(tie.view(tie.own))


@torch.no_grad()
def give_own(ties: Sequence[Tie]) -> None:
    """The seeds' own parameters <- their stacked slices (what checkpoints, evaluation and play read)."""
    for tie in ties:
        tie.view(tie.own).copy_(tie.of(tie.stacked))


def layout_ties(module: nn.Module, layouts: list[Layout], seed: int, model: nn.Module) -> list[Tie]:
    """The ties of seed `seed`'s network `model` in `module`, whose parameters are stacked as `layouts` say."""
    return [Tie(module.get_parameter(name), seed, model.get_parameter(path), view) for name, path, view in layouts]


def linears(mlp: nn.Module) -> list[nn.Linear]:
    return [layer for layer in mlp.modules() if isinstance(layer, nn.Linear)]


# The activations an MLP of rlrun's may have, applied in place: the matmul before it keeps no use for its output, and
# the activation's own backward reads its result, so no new tensor is needed (a fresh one per layer is paid for in
# allocation and page faults at S seeds' sizes).
_IN_PLACE: dict[type[nn.Module], Callable[[Tensor], Tensor]] = {nn.ReLU: torch.relu_, nn.Tanh: torch.tanh_}


def activation_of(mlp: nn.Module) -> Callable[[Tensor], Tensor]:
    """The activation between `mlp`'s layers, as a function that applies it in place (none: the identity)."""
    kinds = tuple(ACTIVATIONS.values())
    layer = next((layer for layer in mlp.modules() if isinstance(layer, kinds)), None)
    return same if layer is None else _IN_PLACE[type(layer)]


class StackedMLP(nn.Module):
    """K MLPs of one shape for each of S seeds as one module: x [S, K, B, in] -> [S, K, B, out], one batched matmul
    (torch.baddbmm) per layer for all S x K. `mlps[s][k]` is seed s's k-th MLP (Linear layers with an activation
    between them and, with activate_last, after the last; what else it holds is not stacked: the caller flattens
    the input). Layer i's weights are [S, K, out_i, in_i] and its biases [S, K, out_i]: each seed's slice laid out as
    its own Linears', so taking and giving them are plain copies. `ties` say where each seed's parameters lie.

    Inside, activations are feature-major, [S * K, features, B]: each layer is W h + b with W as stored, so the
    weights' gradients come out of the backward in their own layout (batch-major activations, h W^T, would give
    them transposed, and a copy per weight to lay them out)."""

    def __init__(self, mlps: Sequence[Sequence[nn.Module]], activate_last: bool = False) -> None:
        super().__init__()
        self.K, self.activation, self.activate_last = len(mlps[0]), activation_of(mlps[0][0]), activate_last
        layers = [[linears(mlp) for mlp in seed] for seed in mlps]  # [S][K][depth]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        self.ties: list[Tie] = []
        for i in range(len(layers[0][0])):
            w = nn.Parameter(torch.stack([torch.stack([m[i].weight.detach() for m in seed]) for seed in layers]))
            b = nn.Parameter(torch.stack([torch.stack([m[i].bias.detach() for m in seed]) for seed in layers]))
            self.weights.append(w)
            self.biases.append(b)
            for s, seed in enumerate(layers):
                for k, m in enumerate(seed):
                    self.ties += [Tie(w, s, m[i].weight, index=(k,)), Tie(b, s, m[i].bias, index=(k,))]

    def forward(self, x: Tensor, members: int | None = None, detached: bool = False) -> Tensor:
        """x [S, K, B, in] -> [S, K, B, out]; with `members`, the first that many of each seed's MLPs only (x [S,
        members, B, in]); `detached` computes the same values with the weights cut from autograd."""
        S, K, B = x.shape[0], x.shape[1], x.shape[2]
        h, last = x.flatten(0, 1).transpose(1, 2), len(self.weights) - 1  # [S * K, in, B]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if members is not None:
                w, b = w[:, :members], b[:, :members]
            if detached:
                w, b = w.detach(), b.detach()
            h = torch.baddbmm(b.flatten(0, 1).unsqueeze(2), w.flatten(0, 1), h)  # W h + b, as Linear per column
            if i < last or self.activate_last:
                h = self.activation(h)
        return h.transpose(1, 2).view(S, K, B, -1)


def _grad(p: Tensor) -> Tensor:
    assert p.grad is not None, "a step before a backward"
    return p.grad


def _per_seed(x: Tensor, S: int) -> tuple[int, ...]:
    """The shape that broadcasts a per-seed [S] tensor against x [S, ...]."""
    return (S, *([1] * (x.dim() - 1)))


def clip_grad_norm_per_seed(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """nn.utils.clip_grad_norm_ for each seed alone, on parameters [S, ...] whose slices s make up seed s's
    parameters; returns each seed's gradient norm before clipping [S]."""
    S = params[0].shape[0]
    norms = torch.stack([_grad(p).reshape(S, -1).square().sum(1) for p in params]).sum(0).sqrt()
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)  # torch's clip_coef, clamped as it clamps it
    for p in params:
        _grad(p).mul_(scale.view(_per_seed(p, S)))
    return norms


class SeedSteps:
    """S seeds' optimizers as one: the optimizer their single runs build (`make`: torch.optim.Adam, RMSprop, ...)
    over every seed's slices of the stacked parameters [S, ...] (leaf views of them). It keeps a state per slice, so
    per seed: seed s's numbers are those its own optimizer would have on its own weights. step(active) hands each
    active seed's slices their gradients' slices and steps; the others' slices get none, so torch.optim leaves their
    weights, moments and step counts as they were (a zeroed gradient would not: Adam's momentum would still move
    them). The update runs in torch's multi-tensor implementation of the same optimizer (fused Adam, foreach
    others; an optimizer of rlrun's own keeps its loop): torch's default on the CPU, a loop over tensors, would take
    S times a single run's calls."""

    def __init__(self, params: list[nn.Parameter], make: MakeOptimizer) -> None:
        self.params, self.S = params, params[0].shape[0]
        self.slices = [[p.detach()[s] for p in params] for s in range(self.S)]  # [S][len(params)], each a leaf
        # torch.optim takes any leaf tensors (MakeOptimizer names them Parameters)
        optimizer = make(cast(list[nn.Parameter], [x for seed in self.slices for x in seed]))
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"SeedSteps keeps each slice's state in a torch.optim optimizer's, not {optimizer}")
        self.optimizer = optimizer
        # The settings as the single runs' optimizers have them (what a seed's checkpoint holds).
        self.settings = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        fusable = params[0].device.type in ("cpu", "cuda")  # where torch's fused Adam runs
        for group in optimizer.param_groups:
            if "fused" in group and fusable:  # Adam's fused kernel (it takes no foreach)
                group["fused"], group["foreach"] = True, False
            elif "foreach" in group:
                group["foreach"] = True

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def lr(self) -> float:
        return float(self.param_groups[0]["lr"])

    @lr.setter
    def lr(self, lr: float) -> None:
        for group in self.param_groups:
            group["lr"] = lr

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, active: Tensor | None = None) -> None:
        """One step of the seeds where active [S] (bool; all when None) is true."""
        on = [True] * self.S if active is None else active.tolist()
        for seed, slices, stepped in zip(range(self.S), self.slices, on):
            for x, p in zip(slices, self.params):
                x.grad = _grad(p)[seed] if stepped else None
        self.optimizer.step()
        for x in (x for seed in self.slices for x in seed):
            x.grad = None

    def steps(self) -> list[int]:
        """Each seed's step count (0 before its first), from its slices' state."""
        return [int(self.optimizer.state.get(seed[0], {}).get("step", 0)) for seed in self.slices]


class SeedOptimizer:
    """A seed's share of SeedSteps as the seed's single-run algorithm holds its optimizer: state_dict() and
    load_state_dict() in the format of the optimizer its single run builds, over the seed's own parameters
    (`params`, in their order; `ties` say where they lie in the stack), so the seed's checkpoint is a single run's
    and a single run's checkpoint loads into the batch. It takes no steps."""

    def __init__(self, steps: SeedSteps, ties: list[Tie], params: list[nn.Parameter]) -> None:
        self.steps, self.seed, self.params = steps, ties[0].seed, params
        # Each of the seed's parameters, in its order: its slice (what the optimizer steps) and its tie.
        where = {id(p): j for j, p in enumerate(steps.params)}
        self.slots = [(steps.slices[t.seed][where[id(t.stacked)]], t) for p in params for t in ties if t.own is p]
        if len(self.slots) != len(params):
            raise ValueError("a seed's optimizer over parameters that are not all stacked")

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The optimizer's groups (one rate for all seeds: their schedules run alike)."""
        return self.steps.param_groups

    def state_dict(self) -> dict[str, Any]:
        state: dict[int, dict[str, Any]] = {}
        for i, (x, tie) in enumerate(self.slots):
            # torch.optim holds no state for a parameter never stepped; a slice's state holds several of the seed's
            # parameters (twin critics) where the tie's index says
            kept = self.steps.optimizer.state.get(x)
            if kept:
                state[i] = {k: self._own(k, v, x, tie) for k, v in kept.items()}
        group = self.steps.settings | {"lr": self.param_groups[0]["lr"]}
        return {"state": state, "param_groups": [group | {"params": list(range(len(self.params)))}]}

    def _own(self, key: str, value: Any, x: Tensor, tie: Tie) -> Any:
        """A slice's state entry as the seed's own parameter's: its step count where the single run's optimizer keeps
        it; shaped as the slice (moments) -> its part, laid out as the parameter; anything else as it is."""
        if key == "step" and isinstance(value, Tensor):
            return _step_as(value, self.steps.settings, x.device)
        if not (isinstance(value, Tensor) and value.shape == x.shape):
            return value.clone() if isinstance(value, Tensor) else value
        own = torch.zeros_like(tie.own)
        tie.view(own).copy_(value[tie.index])
        return own

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved, kept = state["state"], self.steps.optimizer.state
        for i, (x, tie) in enumerate(self.slots):
            if i not in saved:  # never stepped
                kept.pop(x, None)
                continue
            mine = kept.setdefault(x, {})
            for k, v in saved[i].items():
                if k == "step" and isinstance(v, Tensor):  # where the batch's optimizer keeps it
                    mine[k] = _step_as(v, self.param_groups[0], x.device)
                elif isinstance(v, Tensor) and v.shape == tie.own.shape:
                    mine.setdefault(k, torch.zeros_like(x))[tie.index].copy_(tie.view(v))
                else:
                    mine[k] = v.clone() if isinstance(v, Tensor) else v


def _step_as(step: Tensor, settings: dict[str, Any], device: torch.device) -> Tensor:
    """A step count where an optimizer with these settings keeps it (torch.optim's rule, in Optimizer.load_state_dict):
    on its parameters' device in float32 when fused or capturable (the batch steps fused Adam on a GPU), else on the
    CPU. A seed's state and a single run's then hold it alike, and either loads into the other on a GPU."""
    if settings.get("fused") or settings.get("capturable"):
        return step.to(dtype=torch.float32, device=device, copy=True)
    return step.to("cpu", copy=True)


class Running:
    """The seeds of a batch still training: stop() ends one for good (its run failed), and require_finite stops a
    seed whose loss or gradient norm went NaN or infinite, before its optimizer steps, as its single run stops
    there; the errors it found are what update() gives those seeds instead of stats."""

    def __init__(self, S: int) -> None:
        self.mask = torch.ones(S, dtype=torch.bool)  # on the CPU, as SeedSteps.step takes it
        self.failed: dict[int, NonFiniteError] = {}

    def stop(self, seed: int) -> None:
        self.mask[seed] = False

    def require_finite(self, values: Tensor, what: str) -> Tensor:
        """finite.require_finite for each running seed's value of `values` [S] (a loss, a gradient norm); returns the
        seeds still running after it, [S] bool (those whose optimizers may step)."""
        broken = self.mask & ~torch.isfinite(values.detach()).cpu()
        for s in broken.nonzero().flatten().tolist():
            self.failed[s] = nonfinite_error(float(values[s].detach()), what)
        self.mask &= ~broken
        return self.mask.clone()

    def outcomes(self, stats: list[dict[str, float]]) -> list[dict[str, float] | NonFiniteError]:
        """Each seed's stats of an update, or the error that stopped it there (a seed stopped before gets stats
        that mean nothing)."""
        out = [self.failed.get(s, st) for s, st in enumerate(stats)]
        self.failed = {}
        return out


@torch.no_grad()
def polyak_per_seed(target: nn.Module, online: nn.Module, tau: float, running: Tensor) -> None:
    """off_policy.polyak_update of stacked networks [S, ...] for the running seeds [S] only: a stopped seed's
    targets stay as they were."""
    if bool(running.all()):
        polyak_update(target, online, tau)
        return
    for t, o in zip(target.parameters(), online.parameters()):
        weight = (1.0 - (1.0 - tau)) * running.to(t.device, t.dtype).view(_per_seed(t, len(running)))
        t.lerp_(o, weight)


def seed_optimizers(steps: Sequence[SeedSteps], ties: list[Tie]) -> Callable[[list[nn.Parameter]], SeedOptimizer]:
    """What a seed's algorithm makes its optimizers with once it is in a batch (its parts.make_optimizer): for the
    parameters it asks an optimizer for, its share of the SeedSteps among `steps` that steps them (`ties`: the
    seed's)."""

    def make(params: list[nn.Parameter]) -> SeedOptimizer:
        own = {id(p) for p in params}
        for candidate in steps:
            stacked = {id(p) for p in candidate.params}
            if all(id(t.stacked) in stacked for t in ties if id(t.own) in own):
                return SeedOptimizer(candidate, ties, params)
        raise ValueError("a seed asked for an optimizer over parameters that no SeedSteps steps")

    return make


def share_optimizers(algos: Sequence[Any], steps: Sequence[SeedSteps], ties: list[Tie], built: Sequence[str]) -> None:
    """Each seed's algorithm (algos[s], DQN, SAC or TD3) gets its shares of `steps` for optimizers: its declared part
    parts.make_optimizer makes them from now on (it asks of an optimizer only what SeedOptimizer has: state_dict,
    load_state_dict, param_groups). `built`: the names its optimizers, built on first use, have once built; none may
    be yet, or its state would be left behind."""
    for s, algo in enumerate(algos):
        if any(name in vars(algo) for name in built):
            raise ValueError("a seed's optimizer was built before the batch: its state would be left behind")
        algo.parts.make_optimizer = seed_optimizers(steps, [t for t in ties if t.seed == s])


def draw_noise(
    generators: Sequence[torch.Generator], kind: str, shape: tuple[int, ...], device: torch.device
) -> Tensor:
    """Each seed's sampling noise for one step, [S, *shape] on `device`: seed s's from generators[s], drawn on that
    generator's device as its single run draws it from the global generator ("categorical": categorical_sample's
    Exp(1), "gaussian": gaussian_sample's standard normal)."""
    if kind == "categorical":
        drawn = [torch.empty(shape, device=g.device).exponential_(generator=g) for g in generators]
    else:
        drawn = [torch.randn(shape, generator=g, device=g.device) for g in generators]
    return torch.stack(drawn).to(device)


def normalize_per_seed(adv: Tensor) -> Tensor:
    """Each seed's advantages [S, B] to zero mean and unit variance over its own B, as normalize_advantages."""
    mu = adv.mean(1, keepdim=True)
    return (adv - mu) / ((adv - mu).square().mean(1, keepdim=True).sqrt() + 1e-8)


def gae_per_seed(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """compute_gae for each seed's rollout, all [S, T, N] (on any device; the results on values' device): GAE is
    elementwise per env, so the seeds' envs go side by side, [T, S * N]."""
    S, T, N = values.shape

    def side_by_side(x: Tensor) -> Tensor:  # [S, T, N] -> [T, S * N]
        return x.transpose(0, 1).flatten(1).to(values.device)

    def per_seed(x: Tensor) -> Tensor:  # [T, S * N] -> [S, T, N]
        return x.view(T, S, N).transpose(0, 1)

    r, v, nv, term = (side_by_side(x) for x in (rewards, values, next_values, terminated))
    advantages, returns = compute_gae(r, v, nv, term, side_by_side(terminated | truncated), gamma, lam)
    return per_seed(advantages), per_seed(returns)
