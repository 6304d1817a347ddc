"""A second device on a machine without a GPU, for tests of device placement: inside `simulated_device()`,
tensors created on or moved to `SIM` (reported as device "meta") hold real CPU data and compute for real, and
an op that mixes them with non-scalar tensors of the CPU raises DeviceMixing, as CUDA refuses such ops. Code
under test sees `tensor.device != cpu`, so it takes the paths it takes on a GPU (no numpy views of device
tensors, no CPU-only layouts)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

# "meta" because torch accepts it as a device on every build (a CPU-only torch refuses "cuda" before any mode
# can intercept the call); nothing else in rlrun creates meta tensors.
SIM = torch.device("meta")
aten = torch.ops.aten

# What CUDA accepts with CPU tensors among the arguments: copies between devices, and advanced indexing, whose
# CPU indices it moves to the device itself (index_select is not among them: it refuses a CPU index).
_CROSS_DEVICE_OK = {
    aten.copy_.default,
    aten._to_copy.default,
    aten.index.Tensor,
    aten.index_put_.default,
    aten.index_put.default,
    aten._index_put_impl_.default,
}


class DeviceMixing(RuntimeError):
    """An op received tensors of the simulated device and of the CPU."""


class SimTensor(torch.Tensor):
    """A tensor on SIM: a wrapper reporting device SIM around a CPU tensor `elem` that holds its data."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> SimTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=SIM,
            requires_grad=elem.requires_grad,
        )
        r.elem = elem
        return r

    def __repr__(self) -> str:
        return f"SimTensor({self.elem!r})"

    def tolist(self):  # CUDA tensors copy to the host for this; subclasses are refused by default
        return self.elem.tolist()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _on_sim(device) -> bool:
    return isinstance(device, torch.device) and device.type == SIM.type


_MOVES = {aten._to_copy.default, aten.to.dtype_layout, aten.to.device, aten.to.dtype, aten.to.other}


def _run(func, args: tuple, kwargs: dict):
    flat, _ = tree_flatten((args, kwargs))
    sims = [t for t in flat if isinstance(t, SimTensor)]
    hosts = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, SimTensor) and t.dim() > 0]
    if sims and hosts and func not in _CROSS_DEVICE_OK | _MOVES:
        shapes = [tuple(h.shape) for h in hosts]
        raise DeviceMixing(f"{func} got tensors on the device and CPU tensors of shapes {shapes}")
    devices = [d for d in flat if isinstance(d, torch.device)] + ([flat[1].device] if func is aten.to.other else [])
    to_sim = any(_on_sim(d) for d in devices)
    to_host = any(not _on_sim(d) for d in devices)
    unwrap = lambda t: t.elem if isinstance(t, SimTensor) else torch.device("cpu") if _on_sim(t) else t  # noqa: E731
    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if func is aten._local_scalar_dense.default:  # .item()
        return out
    if func in _MOVES:
        return SimTensor(out) if to_sim or (sims and not to_host) else out
    if func is aten.copy_.default and not isinstance(flat[0], SimTensor):
        return out  # device -> host copy into a CPU tensor
    if not (sims or to_sim):
        return out
    schema = func._schema
    if not schema.returns:  # in place on lists (torch._foreach_*_, the fused Adam kernel)
        return None
    if schema.arguments and schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write:
        return flat[0]  # in place (x.add_(y)): the result is x itself
    # A view of a normal tensor is a normal tensor, also under inference_mode (autograd shares its version
    # counter with the base, which an inference tensor cannot).
    view_of_normal = schema.returns and schema.returns[0].alias_info is not None and not flat[0].is_inference()
    with torch.inference_mode(False) if view_of_normal else contextlib.nullcontext():
        return tree_map(lambda t: SimTensor(t) if isinstance(t, torch.Tensor) else t, out)


class _Mode(TorchDispatchMode):
    """Routes factory calls with device=SIM (torch.zeros(..., device=...)) to _run, which plain tensors'
    dispatch would never reach."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


@contextlib.contextmanager
def simulated_device() -> Iterator[torch.device]:
    """Tensors may be created on and moved to the yielded device inside; they must not outlive the block."""
    # torch.tensor and torch.as_tensor with device=meta make real (empty) meta tensors without passing through a
    # dispatch mode: inside, they create on the CPU and move, which does.
    originals = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}
    for name, create in originals.items():
        setattr(torch, name, _created_then_moved(create))
    to = torch.nn.Module.to
    torch.nn.Module.to = _to_keeping_parameters
    try:
        with _Mode():
            yield SIM
    finally:
        torch.nn.Module.to = to
        for name, create in originals.items():
            setattr(torch, name, create)


def _created_then_moved(create):
    def wrapped(data, *args, device=None, **kwargs) -> torch.Tensor:
        if device is not None and _on_sim(torch.device(device)):
            return create(data, *args, **kwargs).to(device)
        return create(data, *args, device=device, **kwargs)

    return wrapped


_MODULE_TO = torch.nn.Module.to


def _to_keeping_parameters(module: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """module.to that keeps each Parameter object, as a move to CUDA does (it swaps .data in place): code may
    hold references to parameters taken before the move. For a tensor subclass that takes swapping them, which
    load_state_dict must not do (an LSTM's weights refuse it), so it is on only during the move."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        return _MODULE_TO(module, *args, **kwargs)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
