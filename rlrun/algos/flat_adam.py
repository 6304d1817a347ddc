"""Adam (Kingma & Ba 2015) over parameters that live in one flat buffer, as do their gradients.

Each parameter's .data and .grad become views into two flat tensors, so zeroing, clipping and the Adam step
are a few operator calls for the whole model instead of a few per parameter: for the small networks RL
trains on CPU that per-call overhead was a quarter of PPO's update time. Autograd, DDP and load_state_dict
write into parameters and gradients in place, so the views stay valid; gradients are zeroed, never set to
None. The step is torch.optim.Adam(fused=True)'s kernel, called directly: building a torch.optim optimizer
imports torch._dynamo, 1.7 s of every run's start on this machine.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def flat_views(flat: Tensor, params: list[Tensor]) -> list[Tensor]:
    """Consecutive slices of the 1-D `flat`, shaped as `params` are (in their order)."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


class FlatAdam:
    """Build it after the model is on its device and in its dtype; afterwards move nothing (.to() would detach
    the parameters from the buffer) and zero gradients with zero_grad() here, never model.zero_grad()."""

    def __init__(self, params: list[nn.Parameter], lr: float, eps: float, betas: tuple[float, float] = (0.9, 0.999)):
        self.lr, self.eps, self.betas = lr, eps, betas
        self.params = torch.cat([p.detach().reshape(-1) for p in params])
        self.grads = torch.zeros_like(self.params)
        for p, data, grad in zip(params, flat_views(self.params, params), flat_views(self.grads, params)):
            p.data, p.grad = data, grad
        self.exp_avg = torch.zeros_like(self.params)
        self.exp_avg_sq = torch.zeros_like(self.params)
        self.steps = torch.zeros((), device=self.params.device)  # a tensor, as the kernel takes it

    def zero_grad(self) -> None:
        self.grads.zero_()

    def clip_grad_norm(self, max_norm: float) -> Tensor:
        """Scale the gradient to a global L2 norm of at most max_norm (as clip_grad_norm_); returns the norm."""
        norm = torch.linalg.vector_norm(self.grads)
        self.grads.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))
        return norm

    @torch.no_grad()
    def step(self, lr: float | None = None) -> None:
        """One Adam step at learning rate `lr` (the constructor's if None)."""
        self.steps.add_(1)
        beta1, beta2 = self.betas
        torch._fused_adam_(  # the kernel behind torch.optim.Adam(fused=True): one pass over the buffers
            [self.params],
            [self.grads],
            [self.exp_avg],
            [self.exp_avg_sq],
            [],
            [self.steps],
            lr=self.lr if lr is None else lr,
            beta1=beta1,
            beta2=beta2,
            weight_decay=0.0,
            eps=self.eps,
            amsgrad=False,
            maximize=False,
        )

    def state_dict(self) -> dict:
        return {"steps": int(self.steps), "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone()}

    def load_state_dict(self, state: dict) -> None:
        if state["exp_avg"].shape != self.params.shape:
            have, want = state["exp_avg"].numel(), self.params.numel()
            raise ValueError(f"optimizer state for {have} parameters, the model has {want}")
        self.steps.fill_(int(state["steps"]))
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
