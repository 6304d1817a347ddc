"""Recurrent cores between an encoder and the policy/value heads: LSTM, GRU and a linear recurrent unit (LRU).

Every core keeps its state in one tensor [B, S] (so storing, masking and checkpointing it is the same for all)
and offers two ways to run: `step(x [B, F], state)` one time step (acting), and `forward(x [T, B, F], state,
starts [T, B])` a whole sequence whose state is reset (multiplied by not-start) where an episode starts
(training). `unroll` (a loop of steps) defines what `forward` computes; LSTM and GRU run it in torch's RNN
kernels between resets, the LRU as a parallel scan.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from rlrun.models.encoders import ACTIVATIONS, layer_init
from rlrun.models.scan import linear_scan

Step = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (x [B, F], state [B, S]) -> (y [B, H], state)
Run = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (x [L, B, F], state [B, S]) -> (y [L, B, H], state)


def not_starts(starts: Tensor, like: Tensor) -> Tensor:
    """1 where the state carries over, 0 where an episode starts: starts [..., B] -> [..., B, 1] in like's
    real dtype, ready to multiply states [..., B, S]."""
    dtype = like.real.dtype if like.is_complex() else like.dtype
    return (~starts).unsqueeze(-1).to(dtype)


def unroll(step: Step, x: Tensor, state: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
    """Run `step` over x [T, B, F] from state [B, S], zeroing the state of env b before step t where
    starts[t, b]. Returns (outputs [T, B, H], final state [B, S])."""
    keep = not_starts(starts, state)
    outputs = []
    for t in range(x.shape[0]):
        y, state = step(x[t], state * keep[t])
        outputs.append(y)
    return torch.stack(outputs), state


def between_resets(run: Run, x: Tensor, state: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
    """The same as `unroll` for a `run(x [L, B, F], state) -> (y [L, B, H], state)` that steps through a stretch
    without resets: called once per stretch between the times where any env starts an episode, so the loop
    over time runs inside torch's RNN kernels (several times faster per step than cell calls from Python on
    CPU), and in as few calls as resets allow."""
    steps = x.shape[0]
    times = starts.any(1).nonzero().squeeze(1).tolist()
    bounds = sorted({0, steps, *times})
    keep = not_starts(starts, state)
    outputs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        y, state = run(x[a:b], state * keep[a])
        outputs.append(y)
    return torch.cat(outputs), state


class LSTMCore(nn.Module):
    """An LSTM; state = [h, c] concatenated, [B, 2H]. Sequences run in nn.LSTM, single steps in torch.lstm_cell
    with the same weights. Orthogonal weights and zero biases (CleanRL's ppo_atari_lstm.py)."""

    def __init__(self, in_dim: int, size: int):
        super().__init__()
        self.rnn = nn.LSTM(in_dim, size)
        _orthogonal_init(self.rnn)
        self.out_dim, self.state_size = size, 2 * size

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        r = self.rnn
        h, c = torch.lstm_cell(x, state.chunk(2, -1), r.weight_ih_l0, r.weight_hh_l0, r.bias_ih_l0, r.bias_hh_l0)
        return h, torch.cat([h, c], -1)

    def _run(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        y, (h, c) = self.rnn(x, tuple(s.unsqueeze(0).contiguous() for s in state.chunk(2, -1)))
        return y, torch.cat([h[0], c[0]], -1)

    def forward(self, x: Tensor, state: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
        return between_resets(self._run, x, state, starts)


class GRUCore(nn.Module):
    """A GRU; state = h, [B, H]. Sequences run in nn.GRU, single steps in torch.gru_cell with the same weights."""

    def __init__(self, in_dim: int, size: int):
        super().__init__()
        self.rnn = nn.GRU(in_dim, size)
        _orthogonal_init(self.rnn)
        self.out_dim, self.state_size = size, size

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        r = self.rnn
        h = torch.gru_cell(x, state, r.weight_ih_l0, r.weight_hh_l0, r.bias_ih_l0, r.bias_hh_l0)
        return h, h

    def _run(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        y, h = self.rnn(x, state.unsqueeze(0).contiguous())
        return y, h[0]

    def forward(self, x: Tensor, state: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
        return between_resets(self._run, x, state, starts)


class LRUCore(nn.Module):
    """A linear recurrent unit (Orvieto et al. 2023, "Resurrecting recurrent neural networks for long
    sequences") followed by a one-layer MLP: [T, B, F] -> [T, B, H].

    h_t = a_t * h_{t-1} + gamma * (B x_t) with a complex diagonal a_t; y_t = Re(C h_t) + D * x_t; output
    act(W y_t + c). The decay is a_t = lambda = exp(-exp(nu) + i exp(theta)) (exponential parametrization,
    stable for any nu), with |lambda| initialized on a ring [R_MIN, R_MAX] and gamma = sqrt(1 - |lambda|^2)
    (the paper's normalization). With `input_decay` the decay is a_t = lambda^(delta_t), delta_t =
    softplus(W_d x_t + b_d) > 0, so the input decides how long to remember (a selective step size as in Mamba,
    Gu & Dao 2023; the same idea as Griffin's RG-LRU, De et al. 2024); delta starts at 1, i.e. as the fixed decay.
    A sequence runs as a parallel scan over time; `step` applies the same update one step at a time.
    State: [B, 2N], the real and imaginary parts of h.
    """

    R_MIN, R_MAX, MAX_PHASE = 0.5, 0.99, math.pi / 4

    def __init__(self, in_dim: int, size: int, activation: str = "tanh", input_decay: bool = False):
        super().__init__()
        u1, u2 = torch.rand(size), torch.rand(size)
        nu = -0.5 * torch.log(u1 * (self.R_MAX**2 - self.R_MIN**2) + self.R_MIN**2)
        self.nu_log = nn.Parameter(nu.log())
        self.theta_log = nn.Parameter((self.MAX_PHASE * u2).log())
        self.gamma_log = nn.Parameter(0.5 * torch.log(1 - torch.exp(-2 * nu)))
        self.B_re = nn.Parameter(torch.randn(size, in_dim) / math.sqrt(2 * in_dim))
        self.B_im = nn.Parameter(torch.randn(size, in_dim) / math.sqrt(2 * in_dim))
        self.C_re = nn.Parameter(torch.randn(in_dim, size) / math.sqrt(size))
        self.C_im = nn.Parameter(torch.randn(in_dim, size) / math.sqrt(size))
        self.D = nn.Parameter(torch.randn(in_dim))
        self.delta = None
        if input_decay:
            self.delta = nn.Linear(in_dim, size)
            nn.init.zeros_(self.delta.weight)
            nn.init.constant_(self.delta.bias, math.log(math.e - 1))  # softplus(b) = 1
        self.mlp = nn.Sequential(layer_init(nn.Linear(in_dim, size)), ACTIVATIONS[activation]())
        self.size, self.out_dim, self.state_size = size, size, 2 * size

    def _coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(a, b) of the recurrence for inputs x [..., F]: complex, [..., N]."""
        log_lambda = torch.complex(-self.nu_log.exp(), self.theta_log.exp())
        if self.delta is None:
            a = log_lambda.exp().expand(*x.shape[:-1], self.size)
        else:
            a = (nn.functional.softplus(self.delta(x)) * log_lambda).exp()
        bx = torch.complex(x @ self.B_re.T, x @ self.B_im.T) * self.gamma_log.exp()
        return a, bx

    def _readout(self, h: Tensor, x: Tensor) -> Tensor:
        features: Tensor = self.mlp(h.real @ self.C_re.T - h.imag @ self.C_im.T + self.D * x)
        return features

    def _complex(self, state: Tensor) -> Tensor:
        return torch.view_as_complex(state.reshape(*state.shape[:-1], self.size, 2).contiguous())

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        a, bx = self._coefficients(x)
        h = a * self._complex(state) + bx
        return self._readout(h, x), torch.view_as_real(h).flatten(-2)

    def forward(self, x: Tensor, state: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
        a, bx = self._coefficients(x)
        h = linear_scan(a * not_starts(starts, state), bx, self._complex(state))
        return self._readout(h, x), torch.view_as_real(h[-1]).flatten(-2)


def _orthogonal_init(cell: nn.Module) -> None:
    for name, p in cell.named_parameters():
        nn.init.orthogonal_(p) if "weight" in name else nn.init.zeros_(p)


def build_core(name: str, in_dim: int, size: int, activation: str, lru_decay: str) -> LSTMCore | GRUCore | LRUCore:
    """The recurrent core named in config (lstm | gru | lru) on features of size in_dim."""
    if name == "lstm":
        return LSTMCore(in_dim, size)
    if name == "gru":
        return GRUCore(in_dim, size)
    return LRUCore(in_dim, size, activation, input_decay=lru_decay == "input")
