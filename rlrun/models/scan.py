"""The linear recurrence h_t = a_t * h_{t-1} + b_t computed over time with a parallel associative scan, in
plain torch: log-depth in the sequence length instead of one Python step per time step."""

from __future__ import annotations

import torch
from torch import Tensor


def linear_scan(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """All states of h_t = a_t * h_{t-1} + b_t (elementwise) for t = 0..T-1, starting from h_{-1} = h0.

    a, b: [T, ...] of one shape, real or complex; h0: the shape of a[0]. Returns h [T, ...]. A reset of the
    state before step t is a_t = 0 (multiply a by not-done): the scan needs no special case for it.

    The pairs (a_t, b_t) are affine maps h -> a h + b, and composing two of them, (a1, b1) then (a2, b2),
    gives (a2 a1, a2 b1 + b2): an associative operator, so all prefixes come from a parallel scan (Blelloch
    1990, "Prefix sums and their applications"; applied to linear recurrences in RNNs by Martin & Cundy 2018,
    "Parallelizing linear recurrent neural nets over sequence length"). This is the odd-even form JAX's
    `lax.associative_scan` uses: O(T) work and 2 log2(T) levels of batched tensor ops; autograd
    differentiates it like any other torch code.
    """
    first = (a[0] * h0 + b[0]).unsqueeze(0)  # fold h0 into the first map, so the scan needs no initial value
    return _scan(a, torch.cat([first, b[1:]]))[1]


def _scan(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Inclusive scan of the affine maps (a_t, b_t) along dim 0: the composition of maps 0..t, for every t."""
    n = a.shape[0]
    if n < 2:
        return a, b
    # Compose neighbours (0, 1), (2, 3), ...: the scan of these pairs gives every odd position's prefix.
    a_lo, b_lo, a_hi, b_hi = a[0 : n - 1 : 2], b[0 : n - 1 : 2], a[1::2], b[1::2]
    a_odd, b_odd = _scan(a_hi * a_lo, a_hi * b_lo + b_hi)
    # An even position t >= 2 is its own map applied after the prefix at t - 1.
    a_even = torch.cat([a[:1], a[2::2] * a_odd[: (n - 1) // 2]])
    b_even = torch.cat([b[:1], a[2::2] * b_odd[: (n - 1) // 2] + b[2::2]])
    return _interleave(a_even, a_odd), _interleave(b_even, b_odd)


def _interleave(even: Tensor, odd: Tensor) -> Tensor:
    """[e0, o0, e1, o1, ...] along dim 0, with len(even) - len(odd) in {0, 1}."""
    if len(even) > len(odd):
        odd = torch.cat([odd, torch.zeros_like(even[:1])])
        return torch.stack([even, odd], 1).flatten(0, 1)[:-1]
    return torch.stack([even, odd], 1).flatten(0, 1)
