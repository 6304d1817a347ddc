"""Faults end cleanly wherever they land: a signal during an evaluation (the first ends it early and stops with a
checkpoint, a second stops at once), Ctrl-C during start-up, and non-finite numbers from an env or an update, which
end the run naming what and where with a finite recovery checkpoint. Real CLI runs, real signals, real files."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ALE_PY_INIT, cli_env, finish, rlrun, signalling_site, tensors_in

# Not serial: each run has a core of its own in the parallel phase, and every deadline here is 10 s or more.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ENVS = """
import gymnasium as gym, numpy as np

class Endless(gym.Wrapper):
    '''CartPole that never ends (no termination, no time limit): an evaluation of it runs until stopped.'''
    def __init__(self):
        super().__init__(gym.make('CartPole-v1', max_episode_steps=None))
    def step(self, action):
        obs, reward, _, _, info = self.env.step(action)
        return np.clip(obs, -1, 1), reward, False, False, info

class NanObs(gym.Wrapper):
    '''CartPole whose observations turn NaN at its 300th step.'''
    def __init__(self):
        super().__init__(gym.make('CartPole-v1'))
        self.t = 0
    def step(self, action):
        self.t += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return (obs * np.nan if self.t >= 300 else obs), reward, terminated, truncated, info

class HugeReward(gym.Wrapper):
    '''CartPole whose rewards (finite as float64) overflow the float32 rollout from its 300th step: the loss is not.'''
    def __init__(self):
        super().__init__(gym.make('CartPole-v1'))
        self.t = 0
    def step(self, action):
        self.t += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, (1e300 if self.t >= 300 else reward), terminated, truncated, info

class NanReset(gym.Wrapper):
    '''CartPole whose first observation, from reset, is NaN.'''
    def __init__(self):
        super().__init__(gym.make('CartPole-v1'))
    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs * np.nan, info

gym.register('Endless-v0', entry_point=Endless)
gym.register('NanReset-v0', entry_point=NanReset)
gym.register('NanObs-v0', entry_point=NanObs)
gym.register('HugeReward-v0', entry_point=HugeReward)
"""
COMMON = ["env.imports=[fault_envs]", "logging.progress=plain", "env.num_envs=2", "eval.num_envs=1"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "fault_envs.py").write_text(ENVS)
    return tmp_path


def _start(folder: Path, run: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlrun", "train", *COMMON, *args, f"hydra.run.dir={run}"]
    return subprocess.Popen(cmd, cwd=folder, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path_glob: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not list(path_glob.parent.glob(path_glob.name)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path_glob} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("second", ["none", "one", "burst"], ids=["one-signal", "two-signals", "a-burst"])
def test_a_signal_during_the_final_evaluation_ends_it_with_the_checkpoint_and_resume_line(folder, second):
    """The final evaluation of an env that never ends runs until stopped: the first SIGINT ends it early (the run
    stops as interrupted, with the final checkpoint kept and the line to continue); with a second one right after,
    the run stops at once, still with its summary and no traceback. So with more, one every 5 ms until the process
    ends: one that comes while Python finalizes does not end it as killed by the signal."""
    run = folder / "run"
    proc = _start(folder, run, "env.id=Endless-v0", "total_steps=512", "eval.every_steps=0", "eval.episodes=2")
    _wait_for(run / "checkpoints" / "ckpt_*.pt", proc)  # the final checkpoint comes right before the final evaluation
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    if second == "one":
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 15  # (the pipes are read after: its output is a few lines)
    while second == "burst" and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
    stdout, stderr, seconds = finish(proc, 30)
    assert seconds < 10, "the evaluation went on"
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert "Traceback" not in stderr and "Ctrl-C again to stop now" in stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signal.SIGINT
    assert summary["resume"] == f"rlrun train resume={run}"
    assert stdout.strip().splitlines()[-1].endswith(f"rlrun train resume={run}")  # the console's last line
    (saved,) = (run / "checkpoints").glob("ckpt_*.pt")
    assert torch.load(saved, weights_only=True)["env_steps"] == 512
    if second:
        return
    # That line finishes the run: the final evaluation it stopped in (capped: the env never ends), then its summary.
    resumed = rlrun("train", f"resume={run}", "eval.max_episode_steps=20", cwd=folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] == 512, summary
    assert summary["eval_episodes"] == 2 and summary["eval_return_mean"] is not None
    assert [s["ended"] for s in summary["sessions"]] == ["interrupted by signal 2", "completed"]
    again = rlrun("train", f"resume={run}", cwd=folder)  # now complete: nothing to do
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr, again.stderr


def test_sigterm_during_a_periodic_evaluation_stops_the_run_at_the_next_iteration(folder):
    run = folder / "run"
    args = ["env.id=Endless-v0", "total_steps=100000", "eval.every_steps=256", "checkpoint.every_steps=0"]
    proc = _start(folder, run, *args)
    for line in proc.stdout:
        if "accelerations:" in line:  # training starts: within a second it reaches the first, endless evaluation
            break
    time.sleep(2.0)
    assert not (run / "metrics.jsonl").exists()  # still evaluating: its interval is logged when the evaluation ends
    proc.send_signal(signal.SIGTERM)
    stdout, stderr, seconds = finish(proc, 30)
    assert seconds < 10 and proc.returncode == 128 + signal.SIGTERM, stderr
    assert "rlrun: SIGTERM: stopping at the end of this step with a checkpoint; SIGTERM again to stop now" in stderr
    assert not re.search(r"^env_steps=\d+ *$", stdout, re.M), stdout  # no episode ended: no line without metrics
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signal.SIGTERM
    assert summary["env_steps"] < 100000 and summary["final_checkpoint"]


@pytest.mark.parametrize(
    ("algo", "env_id", "expected"),
    [
        ("ppo", "NanObs-v0", "env 0 returned a NaN observation in the iteration from env step"),
        ("dqn", "NanObs-v0", "env 0 returned a NaN observation in the iteration from env step"),
        ("ppo", "HugeReward-v0", "the PPO gradient norm is NaN in iteration"),
        ("a2c", "HugeReward-v0", "the A2C gradient norm is NaN in iteration"),
    ],
)
def test_a_non_finite_value_ends_the_run_naming_it_with_a_finite_recovery_checkpoint(folder, algo, env_id, expected):
    run = folder / "run"
    args = [f"algo={algo}", f"env.id={env_id}", "total_steps=20000", "checkpoint.every_steps=0", "eval.every_steps=0"]
    extra = ["algo.learning_starts=100"] if algo == "dqn" else []
    out = rlrun("train", *COMMON, *args, *extra, f"hydra.run.dir={run}", cwd=folder)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr  # (numpy warns about the overflow the test env makes)
    assert expected in out.stderr.strip().splitlines()[-1], out.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and expected in summary["error"]
    (saved,) = (run / "checkpoints").glob("ckpt_*.pt")
    state = torch.load(saved, weights_only=True)
    assert state["recovery"]
    weights = [t for t in tensors_in(state["algo"]) if t.is_floating_point()]
    assert weights and all(torch.isfinite(t).all() for t in weights)


def test_a_nan_observation_from_reset_is_one_line_saying_where_and_what_accepts_it(folder):
    out = rlrun(
        "train", *COMMON, "env.id=NanReset-v0", "total_steps=2048", f"hydra.run.dir={folder / 'run'}", cwd=folder
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    expected = "env 0 returned a NaN observation at its first reset on rank 0; env.check_finite=false accepts it"
    assert expected in out.stderr.strip().splitlines()[-1], out.stderr


def test_check_finite_false_lets_an_env_return_nan(folder):
    """env.check_finite=false: the env check is off; the run then fails in the update, which cannot learn from NaN."""
    args = ["env.id=NanObs-v0", "env.check_finite=false", "total_steps=4000", "eval.every_steps=0"]
    out = rlrun("train", *COMMON, *args, f"hydra.run.dir={folder / 'run'}", cwd=folder)
    assert out.returncode == 1 and "returned a NaN observation" not in out.stderr
    assert "the PPO gradient norm is NaN" in out.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_during_start_up_is_one_line(folder, signum):
    """SIGINT or SIGTERM as soon as the run folder is made (then rlrun imports torch and makes the envs): exit 130
    or 143 within seconds, one line, no traceback, and the folder let go (SIGTERM ended the process silently, its
    lock file left)."""
    proc = _start(folder, folder / "run", "total_steps=100000")
    _wait_for(folder / "run" / ".hydra", proc)
    proc.send_signal(signum)
    _, stderr, seconds = finish(proc, 30)
    assert seconds < 10 and proc.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    line = "rlrun: error: interrupted" if signum == signal.SIGINT else "rlrun: error: stopped by SIGTERM"
    assert stderr.strip().splitlines()[-1] == line, stderr
    assert not (folder / "run" / ".rlrun.lock").exists()


def test_ctrl_c_inside_code_made_by_exec_still_exits_130(folder):
    """SIGINT while the config check imports the user's env module (before any run folder), inside code made by
    exec() of a string (as dataclasses and namedtuples make their methods): one line and exit 130. It was a
    traceback there; and a plain KeyboardInterrupt from such code, even handled, left CPython marking it unhandled,
    so `python -m rlrun` died by SIGINT (-2) after its one line (the start-up test above, now and then)."""
    (folder / "slow_import.py").write_text(
        "import os, signal, time\nexec('os.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(5)')\n"
    )
    out = rlrun("train", "env.imports=[slow_import]", f"hydra.run.dir={folder / 'run'}", cwd=folder, timeout=60)
    assert out.returncode == 128 + signal.SIGINT and not (folder / "run").exists(), out.stderr
    assert out.stderr.strip().splitlines()[-1] == "rlrun: error: interrupted" and "Traceback" not in out.stderr


SWALLOWING = """
import ctypes, os, signal, time, weakref
from pathlib import Path
import gymnasium as gym

def swallowed(signum):
    '''Send this process `signum` while C code calls Python and then clears any error (the C API's PyObject_HasAttr,
    which a C++ extension's hasattr calls): the handler's exception is lost there.'''
    class Probe:
        def __getattr__(self, name):
            os.kill(os.getpid(), signum)
            time.sleep(2)  # the handler runs here, and raises
    has_attr = ctypes.pythonapi.PyObject_HasAttr
    has_attr.argtypes = [ctypes.py_object, ctypes.py_object]
    has_attr(Probe(), 'x')
    Path('lost').touch()  # only if the exception was lost

class Swallowing(gym.Wrapper):
    '''CartPole that, built for the run (its folder made), has a signal's exception swallowed.'''
    def __init__(self):
        super().__init__(gym.make('CartPole-v1'))
        if Path('run', '.hydra').exists() and not Path('lost').exists():
            swallowed(SIGNUM)

def lost_in_a_weakref_callback(signum):
    '''Send this process `signum` inside a weakref callback (an import runs them as its module locks go): Python
    prints the handler's exception there ("Exception ignored in ...") and goes on.'''
    class Gone:
        pass
    def callback(ref):
        os.kill(os.getpid(), signum)
        time.sleep(2)  # the handler runs here, and raises
    gone = Gone()
    ref = weakref.ref(gone, callback)
    del gone
    Path('lost').touch()  # only if the exception was lost

gym.register('Swallowing-v0', entry_point=Swallowing)
if WHERE == 'import':
    swallowed(SIGNUM)
if WHERE == 'weakref':
    lost_in_a_weakref_callback(SIGNUM)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize(
    "where", ["import", "weakref", "env"], ids=["in-the-config-check", "in-a-weakref-callback", "in-the-run"]
)
def test_a_signal_whose_exception_was_lost_still_ends_start_up(folder, where, signum):
    """A start-up signal's exception lost, in C code that clears errors or in a weakref callback (CI saw a SIGTERM
    right after the run folder was made let the run train on): start-up still ends with the signal's line and exit
    status and no traceback, before any run folder when it came in the config check, else where training takes the
    signals, the folder let go."""
    (folder / "swallowing.py").write_text(f"SIGNUM, WHERE = {int(signum)}, {where!r}\n" + SWALLOWING)
    run = folder / "run"
    args = ["env.imports=[swallowing]", "env.id=Swallowing-v0", "total_steps=2048", f"hydra.run.dir={run}"]
    out = rlrun("train", *args, cwd=folder, timeout=60)
    assert out.returncode == 128 + signum and "Traceback" not in out.stderr, out.stderr[-2000:]
    line = "rlrun: error: interrupted" if signum == signal.SIGINT else "rlrun: error: stopped by SIGTERM"
    assert out.stderr.strip().splitlines()[-1] == line, out.stderr
    assert (folder / "lost").exists()  # the exception was lost where the module lost it, not raised there
    if where != "env":
        assert not run.exists()
    else:
        assert not (run / ".rlrun.lock").exists() and not (run / "checkpoints").exists()


# Where each package's C++ initialisation calls Python (a sitecustomize sends SIGTERM from inside it), and a run that
# loads it: (the C call it starts in, the Python call it is sent at: signalling_site's; the run's overrides).
HELD = {
    # torch's C++ initialisation imports Python modules
    "torch": ("getattr(arg, '__name__', '') == '_c10d_init'", "True", ["total_steps=2048"]),
    # ale_py's module init: nanobind makes its enums through Python's enum
    "ale_py": (*ALE_PY_INIT, ["env=breakout"]),
    # mujoco's extension modules (pybind11)
    "mujoco": (
        "entering(frame, arg, 'mujoco.')",
        "True",
        ["algo=sac", "env=halfcheetah", "total_steps=300", "algo.learning_starts=100"],
    ),
}


@pytest.mark.parametrize("package", list(HELD))
def test_a_signal_while_a_package_initialises_is_one_line(folder, package):
    """SIGTERM while a package's C++ initialisation runs Python code: the handler's exception raised there ended the
    process in std::terminate (torch's 'python_error', with its run folder's lock left behind; ale_py's
    'nanobind::python_error': SIGABRT), or became an ImportError that rlrun reported as MuJoCo missing ("pip install
    'rlrun[mujoco]'", exit 2). These packages now load with the signals held, so the signal ends start-up as anywhere
    else: one line, exit 143, no run folder left held."""
    enter, at, overrides = HELD[package]
    (folder / "sitecustomize.py").write_text(signalling_site(enter, at))
    run = folder / "run"
    out = subprocess.run(
        [sys.executable, "-m", "rlrun", "train", *overrides, f"hydra.run.dir={run}"],
        cwd=folder,
        env={**cli_env(), "PYTHONPATH": str(folder)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 128 + signal.SIGTERM and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == "rlrun: error: stopped by SIGTERM", out.stderr
    assert (folder / "sent").exists()  # inside the package's initialisation
    assert not (run / ".rlrun.lock").exists() and not (run / "checkpoints").exists()
    if package == "torch":  # it loads after the run folder is made (the others, for the config's env check, before)
        assert (run / ".hydra").is_dir()
