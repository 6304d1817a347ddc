"""The least time an update can take on this machine with torch's CPU kernels, whoever writes it, and so the highest
speed ratio a run can reach against a peer's measured steps/s. Not rlrun's code: the same kernels called bare, on
buffers allocated once, without autograd, without Python around them beyond the calls.

    .venv/bin/python bench/ceilings.py [--peer td3-pendulum=211 sac-halfcheetah=200 ppo-breakout=396 ...]

- SAC and TD3 (1 thread): an update's matrix products alone (both critics, their targets, the actor and its target,
  the actor's step through the critics: all shapes, small ones included), then with the passes no update can skip
  (ReLU forward in place, its backward as one in-place mask, Adam over each network's flat buffer).
- PPO on Breakout (2 threads): the Nature CNN's forward and backward on a minibatch of 256 channels-last frames, and
  the emulator's raw frame (ALE, frameskip 1, no preprocessing).

With --peer CASE=SPS (a peer's steps/s from bench/peers.py, same day) it prints the ceiling: the peer's time for the
case over the floor's (its updates at the floor, its env steps at the raw env's speed, nothing else), and what an env
step may spend outside that floor at issue 38's goal ratio (GOALS): negative, the goal is beyond the floor itself."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

GOALS = {"sac": 1.5, "td3": 1.5, "ppo": 2.2}  # issue 38's ratios against the peers
H, B = 256, 256  # the cases' hidden width and batch


def median_ms(run: Callable[[int], object], rounds: int = 5, calls: int = 200) -> float:
    for k in range(calls // 4):  # warm up: allocations, MKL's packing buffers, the caches
        run(k)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for k in range(calls):
            run(k)
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


class Mlp:
    """in -> H -> H -> out with ReLU: its buffers, forward and backward as bare kernels into them."""

    def __init__(self, inputs: int, outputs: int):
        w = lambda *shape: torch.randn(*shape) * 0.05  # noqa: E731
        self.w = [w(H, inputs), w(H, H), w(outputs, H)]
        self.b = [w(H), w(H), w(outputs)]
        self.h = [torch.empty(B, H), torch.empty(B, H), torch.empty(B, outputs)]
        self.gh = [torch.empty(B, H), torch.empty(B, H)]
        self.gw = [torch.empty_like(x) for x in self.w]
        self.gb = [torch.empty(1, x.numel()) for x in self.b]
        self.gx = torch.empty(B, inputs)
        self.size = sum(x.numel() for x in self.w + self.b)

    def forward(self, x: Tensor, passes: bool) -> None:
        for i in range(3):
            torch.addmm(self.b[i], x if i == 0 else self.h[i - 1], self.w[i].t(), out=self.h[i])
            if passes and i < 2:
                self.h[i].relu_()

    def backward(self, g: Tensor, x: Tensor, weights: bool, inputs: bool, passes: bool, ones: Tensor) -> None:
        """Gradients from g = d loss / d output: the weights' (not for a critic read with its weights cut from autograd)
        and the input's (the actions', for an actor's loss through a critic)."""
        for i in (2, 1, 0):
            below = x if i == 0 else self.h[i - 1]
            if weights:
                torch.mm(g.t(), below, out=self.gw[i])
                torch.mm(ones, g, out=self.gb[i])
            if i > 0:
                torch.mm(g, self.w[i], out=self.gh[i - 1])
                if passes:  # ReLU's backward: zero where the unit was off (threshold_backward, in place)
                    torch.ops.aten.threshold_backward.grad_input(
                        self.gh[i - 1], self.h[i - 1], 0.0, grad_input=self.gh[i - 1]
                    )
                g = self.gh[i - 1]
            elif inputs:
                torch.mm(g, self.w[0], out=self.gx)


def flat_adam(size: int) -> Callable[[], None]:
    params, grads, m, v = (torch.zeros(size) for _ in range(4))
    step = torch.zeros(())

    def adam() -> None:
        step.add_(1)
        torch._fused_adam_(
            [params], [grads], [m], [v], [], [step], lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0,
            eps=1e-8, amsgrad=False, maximize=False,
        )  # fmt: skip

    return adam


def update_floor(algo: str, obs_dim: int, action_dim: int, passes: bool) -> float:
    """ms per update of SAC (actor, temperature and critics every update) or TD3 (actor every 2nd), as rlrun's and
    the peers' at the cases' settings."""
    torch.set_num_threads(1)
    sac = algo == "sac"
    outputs = 2 * action_dim if sac else action_dim  # SAC's actor: mean and log-std
    actor, actor_target = Mlp(obs_dim, outputs), Mlp(obs_dim, outputs)
    critics = [Mlp(obs_dim + action_dim, 1) for _ in range(2)]
    targets = [Mlp(obs_dim + action_dim, 1) for _ in range(2)]
    obs, x = torch.randn(B, obs_dim), torch.randn(B, obs_dim + action_dim)
    g, g_actor, ones = torch.randn(B, 1), torch.randn(B, outputs), torch.ones(1, B)
    critic_adam, actor_adam = flat_adam(2 * critics[0].size), flat_adam(actor.size)

    def update(k: int) -> None:
        (actor if sac else actor_target).forward(obs, passes)  # the next actions
        for net in targets + critics:
            net.forward(x, passes)
        for net in critics:
            net.backward(g, x, weights=True, inputs=False, passes=passes, ones=ones)
        if passes:
            critic_adam()
        if sac or k % 2 == 0:
            actor.forward(obs, passes)
            for net in critics if sac else critics[:1]:  # SAC's loss reads both critics' minimum, TD3's the first
                net.forward(x, passes)
                net.backward(g, x, weights=False, inputs=True, passes=passes, ones=ones)
            actor.backward(g_actor, obs, weights=True, inputs=False, passes=passes, ones=ones)
            if passes:
                actor_adam()

    return median_ms(update)


def cnn_floor() -> float:
    """ms for the Nature CNN's forward and backward on 256 channels-last frames, 2 threads (PPO's minibatch)."""
    from torch import nn

    torch.set_num_threads(2)
    net = nn.Sequential(
        nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(), nn.Conv2d(64, 64, 3, 1), nn.ReLU(),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 5),
    )  # fmt: skip
    frames = torch.rand(B, 4, 84, 84).contiguous(memory_format=torch.channels_last)
    return median_ms(lambda k: net(frames).sum().backward(), rounds=3, calls=12)


def ale_frame_us() -> float:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0, obs_type="ram")
    env.reset(seed=0)
    actions = torch.randint(0, 4, (4000,)).tolist()

    def frame(k: int) -> None:
        if any(env.step(actions[k % 4000])[2:4]):
            env.reset()

    return median_ms(frame, calls=2000) * 1e3


# case -> (algo, obs dim, action dim, env steps, updates, raw env step in us): bench/peers.py's cases, SAC and TD3
# at 5k steps on Pendulum (its rows' --steps) and their 20k on HalfCheetah (10k of them warm-up, TD3 at 256x256).
CASES = {
    "sac-pendulum": ("sac", 3, 1, 5000, 4900, 9.0),
    "td3-pendulum": ("td3", 3, 1, 5000, 4000, 9.0),
    "sac-halfcheetah": ("sac", 17, 6, 20000, 10000, 35.0),
    "td3-halfcheetah": ("td3", 17, 6, 20000, 10000, 35.0),
}
BREAKOUT = dict(steps=20480, minibatches_per_1024=16, frames_per_step=4)  # peers.py's ppo-breakout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", nargs="*", default=[], help="CASE=SPS: a peer's steps/s for a case, same day")
    args = parser.parse_args()
    peers = {case: float(sps) for case, sps in (p.split("=") for p in args.peer)}
    columns = ["case", "products alone, ms/update", "with ReLU and Adam, ms/update", "floor of the case, s"]
    print("| " + " | ".join(columns + ["peer SPS", "ceiling", "left per env step at the goal"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for case, (algo, obs_dim, action_dim, steps, updates, env_us) in CASES.items():
        products, floor = (update_floor(algo, obs_dim, action_dim, passes) for passes in (False, True))
        seconds = updates * floor / 1e3 + steps * env_us / 1e6
        peer = against(peers.get(case), steps, seconds, algo)
        print(f"| {case} | {products:.2f} | {floor:.2f} | {seconds:.1f} | {peer}", flush=True)
    cnn, frame = cnn_floor(), ale_frame_us()
    iterations = BREAKOUT["steps"] / 1024
    # On 2 cores: the update's passes, then a rollout's emulator frames spread over both cores (the policy's own
    # forward passes, the preprocessing and everything else free).
    seconds = iterations * (BREAKOUT["minibatches_per_1024"] * cnn / 1e3 + 1024 * 4 * frame / 1e6 / 2)
    print(f"| ppo-breakout | Nature CNN fwd+bwd {cnn:.1f} ms/minibatch | ALE frame {frame:.0f} us | {seconds:.1f} |"
          f" {against(peers.get('ppo-breakout'), BREAKOUT['steps'], seconds, 'ppo')}")  # fmt: skip


def against(peer: float | None, steps: int, seconds: float, algo: str) -> str:
    """The table's last columns: the peer's SPS, the ceiling ratio, and the us per env step left at the goal."""
    if peer is None:
        return "- | - | - |"
    left = (steps / peer / GOALS[algo] - seconds) / steps * 1e6
    return f"{peer:.0f} | {steps / peer / seconds:.2f}x | {left:.0f} us |"


if __name__ == "__main__":
    main()
