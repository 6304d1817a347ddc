"""The learner in DDP, with the edge cases users' networks bring: only the parameters the optimizer trains are
synchronized (a target network or a temperature updated otherwise is neither all-reduced nor waited for),
BatchNorm normalizes over every rank's batch, and a parameter the loss does not reach ends the run with its name
instead of DDP's reducer failing an update later with indices (or leaving ranks apart)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from rlrun.errors import UserError

FIX = (
    "use them in the loss, freeze them (requires_grad_(False)), or set distributed.find_unused_parameters=true "
    "if they are used on some steps only"
)


def wrap(
    module: nn.Module,
    trained: Iterable[nn.Parameter],
    device: torch.device,
    find_unused_parameters: bool = False,
    sync_batchnorm: bool = True,
) -> nn.Module:
    """`module` (a learner, whose forward computes the loss) in DDP, synchronizing the gradients of the `trained`
    parameters only. With sync_batchnorm, its BatchNorm layers become SyncBatchNorm (in place: the model that
    acts keeps the same parameters and statistics)."""
    if sync_batchnorm:
        convert_sync_batchnorm(module)
    trained_ids = {id(p) for p in trained}
    # Frozen parameters (no gradient) are no concern of the reducer; those that take gradients but no optimizer's
    # steps are kept out of it. DDP broadcasts what it keeps from rank 0; the rest are broadcast here, so that
    # every rank starts from the same networks, targets included.
    ignored = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in trained_ids]
    with torch.no_grad():
        for name in ignored:
            dist.broadcast(module.get_parameter(name), src=0)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ignored)
    ids = [device.index] if device.type == "cuda" else None
    return Learner(module, device_ids=ids, find_unused_parameters=find_unused_parameters)


class Learner(DistributedDataParallel):
    """DDP that checks, at its first forward, that the loss reaches every parameter it synchronizes (its autograd
    graph holds each one), and names the parameters when DDP finds one that went without a gradient later."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            out = super().forward(*args, **kwargs)
        except RuntimeError as e:
            if "Expected to have finished reduction" not in str(e):
                raise
            names = [n for i, n in enumerate(self._synced_names()) if f" {i}" in _unreached_indices(str(e))]
            raise UserError(f"parameters that got no gradient in the last update: {', '.join(names)}; {FIX}") from e
        if not getattr(self, "_checked", False) and torch.is_grad_enabled():
            self._checked = True
            if not self.find_unused_parameters:
                self._check_reached(out)
        return out

    def _synced_names(self) -> list[str]:
        """The names of the parameters DDP synchronizes, in its order (the indices its errors give)."""
        ignored, names, seen = set(self.parameters_to_ignore), [], set()
        for module_name, m in self.module.named_modules():
            for name, p in m.named_parameters(recurse=False):
                full = f"{module_name}.{name}" if module_name else name
                if p.requires_grad and full not in ignored and id(p) not in seen:
                    seen.add(id(p))
                    names.append(full)
        return names

    def _check_reached(self, out: Any) -> None:
        reached = _graph_leaves(out)
        ignored = set(self.parameters_to_ignore)
        missing = [
            n
            for n, p in self.module.named_parameters()
            if p.requires_grad and n not in ignored and id(p) not in reached
        ]
        if missing:
            raise UserError(f"parameters the loss does not reach: {', '.join(missing)}; {FIX}")


def _unreached_indices(message: str) -> str:
    """' 4 5' from DDP's 'Parameter indices which did not receive grad for rank 0: 4 5' (padded for matching)."""
    line = next((x for x in message.splitlines() if "did not receive grad" in x), "")
    return " " + line.rpartition(":")[2].strip() + " "


def _graph_leaves(out: Any) -> set[int]:
    """ids of the leaf tensors (parameters) in the autograd graph of every tensor in `out` (nested tuples, lists
    and dicts)."""
    stack = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
    seen, leaves = set(), set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):  # AccumulateGrad: where a leaf's gradient lands
            leaves.add(id(fn.variable))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return leaves


def _tensors(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are over the batches of all ranks, on any device (torch's SyncBatchNorm
    is CUDA-only): sums, sums of squares and counts are all-reduced, differentiably, so gradients flow to every
    rank's inputs as through one big batch. In eval mode, or without a process group, it is plain BatchNorm: acting
    and evaluation (which some ranks do alone) run no collective."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        dims = [0, *range(2, x.dim())]
        count = torch.full((1,), x.numel() / x.shape[1], device=x.device, dtype=x.dtype)
        totals: Tensor = _AllReduceSum.apply(torch.cat([x.sum(dims), x.square().sum(dims), count]))
        channels, n = x.shape[1], totals[-1]
        mean = totals[:channels] / n
        var = (totals[channels : 2 * channels] / n - mean.square()).clamp_min(0)  # biased, as BatchNorm normalizes
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean, momentum)
                self.running_var.lerp_(var * n / (n - 1).clamp_min(1), momentum)  # unbiased, as BatchNorm keeps
        shape = [1, channels] + [1] * (x.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


class _AllReduceSum(torch.autograd.Function):
    """The sum over ranks, differentiable: each rank's input gets the sum of all ranks' output gradients."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # ctx: autograd's context (unused)
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def convert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm layer inside `module` (in place) by a SyncBatchNorm sharing its parameters and
    statistics; returns `module`."""
    for name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, SyncBatchNorm):
            sync = SyncBatchNorm(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            if child.affine:
                sync.weight, sync.bias = child.weight, child.bias
            if child.track_running_stats:
                sync.running_mean, sync.running_var = child.running_mean, child.running_var
                sync.num_batches_tracked = child.num_batches_tracked
            sync.train(child.training)
            setattr(module, name, sync)
        else:
            convert_sync_batchnorm(child)
    return module
