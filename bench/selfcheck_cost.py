"""The cost of the accelerations' self-checks (rlrun/fast/selfcheck.py): the seconds they take inside one `rlrun
train` (by default CartPole PPO, the fused loss and numpy acting both checking themselves), against the run's
seconds. Extra arguments are train overrides.

    .venv/bin/python bench/selfcheck_cost.py [total_steps=100000 ...]
"""

from __future__ import annotations

import sys
import tempfile
import time

from rlrun.fast import selfcheck


def main() -> None:
    spent = [0.0]

    def timed(check):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return check(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start

        return run

    # The learner's check is its difference(); numpy acting checks inside its first act (or value): both timed whole.
    selfcheck.CheckedLearner.difference = timed(selfcheck.CheckedLearner.difference)
    act, value = selfcheck.CheckedPolicy.act, selfcheck.CheckedPolicy.value
    selfcheck.CheckedPolicy.act = lambda self, obs: (act if self.checked else timed(act))(self, obs)
    selfcheck.CheckedPolicy.value = lambda self, obs: (value if self.checked else timed(value))(self, obs)

    from rlrun.cli import main as cli

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        try:
            cli(["train", f"hydra.run.dir={folder}/run", *sys.argv[1:]])
        except SystemExit:
            pass
        total = time.perf_counter() - start
    print(f"self-checks: {spent[0] * 1e3:.1f} ms of a {total:.1f} s run ({spent[0] / total:.2%})")


if __name__ == "__main__":
    main()
