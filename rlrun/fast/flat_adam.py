"""Adam (Kingma & Ba 2015) over parameters that live in one flat buffer, as do their gradients: a drop-in for
torch.optim.Adam as the algorithms use it (zero_grad, step, param_groups' "lr", state_dict in Adam's format).

Each parameter's .data and .grad become views into two flat tensors, so zeroing, clipping and the Adam step
are a few operator calls for the whole model instead of a few per parameter: for the small networks RL
trains on CPU, that per-call overhead is a large share of an update. Autograd, DDP and load_state_dict
write into parameters and gradients in place, so the views stay valid; gradients are zeroed, never set to
None. The step is torch.optim.Adam(fused=True)'s kernel, called directly.

On CPU the kernel runs with denormals flushed (FTZ and DAZ, on the calling thread, for the call alone). A ReLU unit
that is off for a whole batch gives its weights zero gradients, and their first moments decay by beta1 a step: in a
few hundred steps they fall below float32's normal range (2^-126) and stay at its smallest denormal (0.9 x 2^-149
rounds back to it). x86 computes on denormals through a microcode assist many times slower, and in SAC's and TD3's
critics many moments end up there. Flushed, they are 0 instead: the moments differ below 2^-126, the parameters not
at all. A moment that small moves a parameter by at most lr x 10 x 2^-126 / eps (bias correction at most 10): under
half an ulp of any parameter above about 1e-19 at lr <= 1 and eps >= 1e-10 (a parameter below 2^-126 is read as 0).
A second moment below 2^-126 changes sqrt(v_hat) + eps by under half an ulp of such an eps (bias correction at most
1 / (1 - beta2)). At a smaller eps the kernel runs unflushed. tests/unit/test_fast_paths.py steps both side by side
and compares the parameters' bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


def flat_views(flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    """Consecutive slices of the 1-D `flat`, shaped as `params` are (in their order)."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


def flatten(params: Sequence[Tensor]) -> Tensor:
    """One new 1-D tensor holding `params`' values in their order, each parameter's .data made a view into it."""
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    for p, view in zip(params, flat_views(flat, params)):
        p.data = view
    return flat


FLUSH_MIN_EPS = 1e-10  # the smallest eps at which flushed moments leave the parameters' bits as they are


@contextmanager
def denormals_flushed(flush: bool) -> Iterator[None]:
    """CPU arithmetic on this thread with denormal inputs read as 0 and denormal results written as 0, while inside
    (when `flush`, and the CPU can: torch.set_flush_denormal says)."""
    flushing = flush and torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flushing:
            torch.set_flush_denormal(False)


class FlatAdam:
    """Build it after the model is on its device and in its dtype; afterwards move nothing (.to() would detach
    the parameters from the buffer)."""

    def __init__(self, params: Iterable[Tensor], lr: float, eps: float, betas: tuple[float, float] = (0.9, 0.999)):
        self.owned = list(params)
        self.eps, self.betas = eps, betas
        self.param_groups: list[dict[str, Any]] = [
            {"lr": lr}
        ]  # as torch.optim's: the algorithms set the annealed rate here
        self.params = flatten(self.owned)
        self.grads = torch.zeros_like(self.params)
        for p, grad in zip(self.owned, flat_views(self.grads, self.owned)):
            p.grad = grad
        self.exp_avg = torch.zeros_like(self.params)
        self.exp_avg_sq = torch.zeros_like(self.params)
        self.steps = torch.zeros((), device=self.params.device)  # a tensor, as the kernel takes it
        self.flush = self.params.device.type == "cpu"  # (the module's docstring says why)

    def zero_grad(self) -> None:
        self.grads.zero_()

    def clip_grad_norm_(self, parameters: Iterable[Tensor], max_norm: float) -> Tensor:
        """nn.utils.clip_grad_norm_ for `parameters`, which must be those this optimizer holds (the algorithms
        pass their model's): three calls on the flat gradient."""
        norm: Tensor = torch.linalg.vector_norm(self.grads)
        self.grads.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))
        return norm

    @torch.no_grad()
    def step(self) -> None:
        self.steps.add_(1)
        beta1, beta2 = self.betas
        with denormals_flushed(self.flush and self.eps >= FLUSH_MIN_EPS):
            torch._fused_adam_(  # the kernel behind torch.optim.Adam(fused=True): one pass over the buffers
                [self.params],
                [self.grads],
                [self.exp_avg],
                [self.exp_avg_sq],
                [],
                [self.steps],
                lr=self.param_groups[0]["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=0.0,
                eps=self.eps,
                amsgrad=False,
                maximize=False,
            )

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam's state_dict for the same parameters, so either optimizer resumes the other's."""
        moments = zip(flat_views(self.exp_avg, self.owned), flat_views(self.exp_avg_sq, self.owned))
        step = self.steps.detach().cpu().clone()
        group = {"lr": self.param_groups[0]["lr"], "betas": self.betas, "eps": self.eps, "weight_decay": 0.0}
        group |= {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False}
        group |= {"differentiable": False, "fused": None, "params": list(range(len(self.owned)))}
        state = {
            i: {"step": step.clone(), "exp_avg": m.clone(), "exp_avg_sq": v.clone()} for i, (m, v) in enumerate(moments)
        }
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["param_groups"][0]["params"]
        if len(saved) != len(self.owned):
            raise ValueError(f"optimizer state for {len(saved)} parameters, the model has {len(self.owned)}")
        group = state["param_groups"][0]  # its settings win, as in torch.optim.Adam.load_state_dict
        self.param_groups[0]["lr"], self.eps, self.betas = group["lr"], group["eps"], tuple(group["betas"])
        per_param = [state["state"].get(i) for i in saved]
        if any(s is None for s in per_param):  # never stepped
            self.steps.zero_()
            self.exp_avg.zero_()
            self.exp_avg_sq.zero_()
            return
        self.steps.fill_(float(per_param[0]["step"]))
        for m, v, s in zip(flat_views(self.exp_avg, self.owned), flat_views(self.exp_avg_sq, self.owned), per_param):
            m.copy_(s["exp_avg"])
            v.copy_(s["exp_avg_sq"])


class FlatAdams:
    """An algorithm's two optimizer parts (rlrun/algos/parts.py) over FlatAdam: `make` builds one over the given
    parameters; `clip_grad_norm_` clips on the flat gradient of the one built last (the algorithms that clip, PPO
    and DQN, have one optimizer; SAC's and TD3's, several, clip none)."""

    def __init__(self, lr: float, eps: float):
        self.lr, self.eps = lr, eps
        self.last: FlatAdam | None = None

    def make(self, params: list[nn.Parameter]) -> FlatAdam:
        self.last = FlatAdam(params, self.lr, self.eps)
        return self.last

    def clip_grad_norm_(self, parameters: list[nn.Parameter], max_norm: float) -> Tensor:
        assert self.last is not None, "clip_grad_norm_ before the optimizer was made"
        return self.last.clip_grad_norm_(parameters, max_norm)
