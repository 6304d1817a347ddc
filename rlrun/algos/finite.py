"""The guard an update runs before its optimizer steps: a non-finite loss or gradient norm ends the run there, so
the parameters and optimizer state it leaves (and any checkpoint of them) stay finite."""

from __future__ import annotations

from torch import Tensor

from rlrun.errors import NonFiniteError


def require_finite(x: Tensor, what: str) -> None:
    """Raise NonFiniteError naming `what` when the scalar `x` is NaN or infinite (one device sync)."""
    value = float(x.detach())
    if value != value or value in (float("inf"), float("-inf")):
        raise nonfinite_error(value, what)


def nonfinite_error(value: float, what: str) -> NonFiniteError:
    """The error that names `what` as the NaN or infinite `value`."""
    return NonFiniteError(f"{what} is {'NaN' if value != value else 'infinite'}")
