"""Any environment a researcher brings (issue 33): presets that apply only to the env they were tuned for,
errors that name the real cause, every gymnasium observation and action space the algorithms take, on real
third-party envs (the `envs` extra: Box2D, MiniGrid) and small envs written here."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from rlrun.config.preflight import preflight
from rlrun.config.store import register_configs
from rlrun.errors import UserError
from tests.conftest import rlrun

register_configs()

PRESETS = [
    ([], None),  # CartPole's own tuned PPO
    (["env.id=LunarLander-v3"], "~tuned"),  # not CartPole's preset on another env
    (["algo=dqn", "env.id=Acrobot-v1"], "~tuned"),
    (["env=lunarlander"], None),  # rl-zoo3's LunarLander PPO
    (["algo=sac", "env.id=MountainCarContinuous-v0"], "tuned=sac_default"),  # SB3's defaults for any Box env
    (["algo=td3", "env=pendulum", "env.id=MountainCarContinuous-v0"], "tuned=td3_default"),
    (["algo=sac", "env=pendulum"], None),
    (["env=breakout", "env.id=ALE/Pong-v5"], None),  # the Atari presets are for every game
    (["env.id=Acrobot-v1", "tuned=ppo_cartpole"], None),  # chosen on the command line: kept
]


@pytest.mark.parametrize("args, added", PRESETS, ids=[" ".join(a) or "defaults" for a, _ in PRESETS])
def test_a_tuned_preset_applies_only_to_the_env_it_was_tuned_for(args, added):
    out = preflight("train", args)
    assert [a for a in out if a not in args] == ([added] if added else [])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_presets_are_logged_and_a_sweep_over_env_ids_decides_per_job(tmp_path):
    out = rlrun(
        "train",
        "-m",
        "env.id=Acrobot-v1,CartPole-v1",
        "total_steps=1024",
        "eval.episodes=1",
        f"hydra.sweep.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        "presets: algo=ppo defaults; env=cartpole group with env.id=Acrobot-v1: tuned/ppo_cartpole not applied"
        in out.stdout
    )
    assert "presets: tuned/ppo_cartpole (tuned for CartPole-v1)" in out.stdout
    acrobot, cartpole = (yaml.safe_load((tmp_path / j / ".hydra/config.yaml").read_text()) for j in "01")
    assert acrobot["algo"]["num_steps"] == 128 and cartpole["algo"]["num_steps"] == 32  # PPO's defaults; the preset
    assert "~tuned" in yaml.safe_load((tmp_path / "0/.hydra/overrides.yaml").read_text())


# Envs written here: a target to hit with MultiDiscrete or MultiBinary actions (reward: the matching components),
# image observations in height-width-channel layout, and a Dict observation with a key no network can take.
ENVS = '''
import gymnasium as gym
import numpy as np


class Target(gym.Env):
    """Each step rewards the components of the action that match a fixed target; 8 steps an episode."""

    def __init__(self, kind="multidiscrete"):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        if kind == "multidiscrete":
            self.action_space, self.target = gym.spaces.MultiDiscrete([3, 4]), np.array([2, 1])
        else:
            self.action_space, self.target = gym.spaces.MultiBinary(4), np.array([1, 0, 1, 1])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float((np.asarray(action) == self.target).sum())
        return np.zeros(2, np.float32), reward, False, self.t >= 8, {}


class Frames(gym.Env):
    """uint8 frames [H, W, 3]: the right action is the one whose half of the frame is lit; 8 steps an episode."""

    def __init__(self, size=7):
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(2)

    def _frame(self):
        self.side = int(self.np_random.integers(2))
        frame = np.zeros((self.size, self.size, 3), np.uint8)
        half = self.size // 2
        frame[:, :half] = 255 if self.side == 0 else 0
        frame[:, half:] = 255 if self.side == 1 else 0
        return frame

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        reward = float(action == self.side)
        return self._frame(), reward, False, self.t >= 8, {}


class Notes(gym.Env):
    """A Dict observation: a position (Discrete), a vector (Box) and a note (Text) no network takes; the reward is
    for repeating the position as the action."""

    def __init__(self, noise=False):
        self.noise = noise  # the vector: noise around 3 (what normalization rescales), or zeros
        self.observation_space = gym.spaces.Dict(
            {"pos": gym.spaces.Discrete(3), "vec": gym.spaces.Box(-10, 10, (2,)), "note": gym.spaces.Text(8)}
        )
        self.action_space = gym.spaces.Discrete(3)

    def _obs(self):
        self.pos = int(self.np_random.integers(3))
        vec = 3 + 2 * self.np_random.standard_normal(2) if self.noise else np.zeros(2)
        return {"pos": self.pos, "vec": vec.astype(np.float32), "note": "hi"}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = float(action == self.pos)
        return self._obs(), reward, False, self.t >= 8, {}


class Masked(gym.Env):
    """Action 0 pays 2, action 1 pays 1, action 2 nothing; at each step action 0 or action 1 is illegal (raises),
    which the mask says: in an action_mask key of a Dict observation, or through action_masks() (method=True).
    The best legal play scores 8 x 1.5 = 12; random legal play 6."""

    def __init__(self, method=False):
        self.method = method
        box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        mask = gym.spaces.MultiBinary(3)
        self.observation_space = box if method else gym.spaces.Dict({"pos": box, "action_mask": mask})
        self.action_space = gym.spaces.Discrete(3)

    def action_masks(self):
        return self.mask

    def _obs(self):
        self.mask = np.array([0, 1, 1] if self.np_random.integers(2) else [1, 0, 1], np.int8)
        pos = np.zeros(2, np.float32)
        return pos if self.method else {"pos": pos, "action_mask": self.mask}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if not self.mask[action]:
            raise RuntimeError(f"illegal action {action} under mask {self.mask}")
        self.t += 1
        return self._obs(), float([2, 1, 0][action]), False, self.t >= 8, {}


class Broken(gym.Env):
    def __init__(self):
        raise ValueError("the simulator's licence file is missing")


gym.register("TargetMD-v0", entry_point=Target, kwargs={"kind": "multidiscrete"})
gym.register("TargetMB-v0", entry_point=Target, kwargs={"kind": "multibinary"})
gym.register("Frames-v0", entry_point=Frames)
gym.register("Notes-v0", entry_point=Notes)
gym.register("Broken-v0", entry_point=Broken)
gym.register("Masked-v0", entry_point=Masked)
gym.register("MaskedMethod-v0", entry_point=Masked, kwargs={"method": True})
'''


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "spaces_envs.py").write_text(ENVS)
    return tmp_path


def _final(run) -> float:
    return json.loads((run / "summary.json").read_text())["eval_return_mean"]


ERRORS = [
    (["env.id=CartPole-v1", "+env.kwargs.colour=1"], "cannot make env 'CartPole-v1' with env.kwargs={'colour': 1}"),
    (["env.id=Notes-v0"], "Notes-v0's observation key 'note' (Text) cannot be encoded for a network; drop it with"),
    (["env.id=Notes-v0", "env.obs_keys=[pos,size]"], "env.obs_keys: Notes-v0's observations have no key 'size'"),
    (["algo=dqn", "env.id=TargetMD-v0"], "algo=dqn needs a discrete action space (Discrete); TargetMD-v0 has"),
    (["algo=sac", "env.id=TargetMB-v0"], "algo=sac needs a continuous action space (a 1-D Box); TargetMB-v0 has"),
    (["env.id=Masked-v0", "algo.normalize_obs=true"], "algo.normalize_obs=true would rescale Masked-v0's action masks"),
    (  # a replay of uint8 frames is sized in bytes, and refused before the run when it cannot fit
        ["algo=sac", "env.id=CarRacing-v3", "algo.buffer_size=100_000_000"],
        "algo.buffer_size=100000000 observations of CarRacing-v3 (uint8 [3, 96, 96]) take 2574.9 GiB per rank",
    ),
]


def test_errors_name_the_real_cause(folder, monkeypatch):
    """The pre-flight (which every `rlrun train` runs first) says what is wrong in one line; an env constructor's
    own exception stays the env's, not a complaint about env.kwargs."""
    monkeypatch.chdir(folder)  # env.imports finds spaces_envs.py in the working directory, as the CLI does
    for args, message in ERRORS:
        with pytest.raises(UserError) as info:
            preflight("train", ["env.imports=[spaces_envs]", *args])
        assert message in str(info.value) and "\n" not in str(info.value), (args, str(info.value))
    with pytest.raises(ValueError, match="the simulator's licence file is missing"):
        preflight("train", ["env.imports=[spaces_envs]", "env.id=Broken-v0"])
    if "MiniGrid-Empty-5x5-v0" not in gym.registry:  # until minigrid is imported
        with pytest.raises(UserError, match="registered by the minigrid module: add env.imports=\\[minigrid\\]"):
            preflight("train", ["env.id=MiniGrid-Empty-5x5-v0"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_multidiscrete_and_multibinary_actions_learn_with_ppo_a2c_and_an_lstm(folder):
    """Rewards are the matching components, 8 steps an episode: random play gets 8 x (1/3 + 1/4) = 4.7 on
    MultiDiscrete([3, 4]) and 8 x 2 = 16 on MultiBinary(4); the best, 16 and 32."""
    common = ["env.imports=[spaces_envs]", "env.num_envs=4", "eval.episodes=4", "eval.num_envs=2", "seed=1"]
    runs = [
        (["env.id=TargetMD-v0", "total_steps=2048", "algo.num_steps=32"], 15.0),
        (["algo=a2c", "env.id=TargetMB-v0", "total_steps=2000", "algo.lr=3e-3"], 30.0),
        (["model=lstm", "env.id=TargetMD-v0", "total_steps=2048", "algo.num_steps=32", "algo.num_minibatches=2"], 15.0),
    ]
    for i, (args, threshold) in enumerate(runs):
        run = folder / f"run{i}"
        out = rlrun("train", *common, *args, f"hydra.run.dir={run}", cwd=folder)
        assert out.returncode == 0, out.stderr[-2000:]
        assert _final(run) >= threshold, (args, _final(run))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_discrete_image_and_dict_observations_learn_and_play(folder):
    """FrozenLake (non-slippery; Discrete observations as one-hots) with PPO and DQN reach the goal (return 1, from
    0 at random); frames in height-width-channel layout (7x7: the small CNN) and a Dict observation with its Text
    key dropped (env.obs_keys) score 8 of 8 (random: 4, 2.7). `rlrun play` of the Dict run imports env.imports."""
    mine = ["env.imports=[spaces_envs]", "env.num_envs=4", "algo.num_steps=32", "total_steps=2048"]
    runs = {
        "frozen_ppo": (["env=frozenlake", "total_steps=4096"], 1.0),  # conf/tuned/ppo_frozenlake.yaml
        "frozen_dqn": (["algo=dqn", "env=frozenlake"], 1.0),  # the preset's 5k steps (seed 1: 1.0 from 4k on)
        "frames": ([*mine, "env.id=Frames-v0"], 7.0),
        "dict": ([*mine, "env.id=Notes-v0", "env.obs_keys=[pos,vec]"], 7.0),
    }
    for name, (args, threshold) in runs.items():
        run = folder / name
        out = rlrun("train", *args, "seed=1", "eval.episodes=4", "eval.num_envs=2", f"hydra.run.dir={run}", cwd=folder)
        assert out.returncode == 0, out.stderr[-2000:]
        assert _final(run) >= threshold, (name, _final(run))
    out = rlrun("play", f"checkpoint={folder / 'dict'}", "episodes=2", cwd=folder)
    assert out.returncode == 0 and "unknown env id" not in out.stderr, out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_minigrid_dict_observations_give_the_image_key_a_cnn_and_learn_with_ppo_and_an_lstm(tmp_path):
    """MiniGrid-Empty-5x5's Dict observation (image 7x7x3 uint8, direction Discrete(4); the Text mission dropped by
    env.obs_keys): the image key gets the small CNN beside the direction's one-hot (one encoder per key, SB3's
    CombinedExtractor), and PPO, feedforward and with an LSTM, reaches the goal in few steps: 0.955 at best, 0 for
    the untrained greedy policy (it turns in place), about 0.2 at random."""
    common = [
        "env.id=MiniGrid-Empty-5x5-v0",
        "env.imports=[minigrid]",
        "env.obs_keys=[image,direction]",
        "env.num_envs=8",
        "algo.lr=1e-3",
        "algo.num_steps=32",
        "seed=1",
        "eval.episodes=8",
    ]
    runs = {"mlp": ["total_steps=8192"], "lstm": ["model=lstm", "algo.num_minibatches=2", "total_steps=12288"]}
    for name, args in runs.items():
        run = tmp_path / name
        out = rlrun("train", *common, *args, f"hydra.run.dir={run}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        assert _final(run) >= 0.8, (name, _final(run))
        (checkpoint,) = (run / "checkpoints").glob("*.pt")
        model = torch.load(checkpoint, weights_only=True)["algo"]["model"]
        assert any(".cnns.0.conv.0.weight" in k for k in model), list(model)  # the image's own CNN


def test_dict_image_keys_lie_channel_first_where_every_network_gives_them_a_cnn():
    """MiniGrid's encoded Dict observation holds its image [7, 7, 3] as [3, 7, 7] at the offset the space names,
    beside the direction's one-hot; the feedforward and recurrent actor-critics and DQN's network each give it the
    small CNN (one encoder per key)."""
    from rlrun.config import EnvConfig, ModelConfig
    from rlrun.envs import env_spaces, make_env
    from rlrun.models import build_actor_critic
    from rlrun.models.encoders import CombinedEncoder, SmallCNN
    from rlrun.models.q_network import build_q_network

    cfg = EnvConfig(id="MiniGrid-Empty-5x5-v0", imports=["minigrid"], obs_keys=["image", "direction"])
    obs_space, action_space = env_spaces(cfg)
    ((offset, chw),) = obs_space.images
    assert chw == (3, 7, 7) and obs_space.shape == (4 + 147,)
    env = make_env(cfg, train=False)()
    obs, _ = env.reset(seed=0)
    raw = env.unwrapped.gen_obs()  # the same state's Dict observation, as MiniGrid gives it
    image = obs[offset : offset + 147].reshape(chw)
    assert np.array_equal(image, raw["image"].transpose(2, 0, 1))
    assert np.array_equal(obs[:4], np.eye(4)[raw["direction"]])  # "direction" sorts before "image"
    nets = [
        build_actor_critic(ModelConfig(), obs_space, action_space).trunk,
        build_actor_critic(ModelConfig(name="lstm"), obs_space, action_space).encoder,
        build_q_network(ModelConfig(), obs_space, action_space, dueling=False).encoder,
    ]
    for net in nets:
        assert isinstance(net, CombinedEncoder) and isinstance(net.cnns[0], SmallCNN)
        assert net(torch.as_tensor(obs[None])).shape == (1, 64)


def test_images_get_a_cnn_in_channel_first_layout_whatever_the_env_gives(folder, monkeypatch):
    """Frames [H, W, 3] reach the networks as [3, H, W] uint8; 7x7 ones get the small CNN, 40x40 the Nature CNN
    (which needs 36x36), with model=mlp as with model=nature_cnn; DQN's network too."""
    from rlrun.config import EnvConfig, ModelConfig
    from rlrun.envs import env_spaces
    from rlrun.models import build_actor_critic
    from rlrun.models.encoders import NatureCNN, SmallCNN
    from rlrun.models.q_network import build_q_network

    monkeypatch.chdir(folder)
    for size, cnn in ((7, SmallCNN), (40, NatureCNN)):
        obs_space, action_space = env_spaces(EnvConfig(id="Frames-v0", imports=["spaces_envs"], kwargs={"size": size}))
        assert obs_space.shape == (3, size, size) and obs_space.dtype == "uint8"
        for name in ("mlp", "nature_cnn"):
            model = build_actor_critic(ModelConfig(name=name), obs_space, action_space)
            assert isinstance(model.trunk, cnn)
            assert model.act(torch.from_numpy(obs_space.sample()[None]))[0].shape == (1,)
        q = build_q_network(ModelConfig(), obs_space, action_space, dueling=False)
        assert isinstance(q.encoder, cnn)


def test_normalize_obs_rescales_the_float_keys_only(folder, monkeypatch):
    """algo.normalize_obs on a Dict observation: its float vector is rescaled, its one-hot keeps 0 and 1; on
    observations as the env gives them (CartPole), every entry is rescaled, as before."""
    from rlrun.algos.normalize import RunningMoments, float_entries
    from rlrun.config import EnvConfig
    from rlrun.envs import env_spaces, make_env

    monkeypatch.chdir(folder)
    cfg = EnvConfig(id="Notes-v0", imports=["spaces_envs"], obs_keys=["pos", "vec"], kwargs={"noise": True})
    obs_space, _ = env_spaces(cfg)
    env = make_env(cfg, train=True, seed=0)()
    obs = [env.reset(seed=0)[0]] + [env.step(0)[0] for _ in range(200)]
    x = torch.as_tensor(np.stack(obs))
    rms = RunningMoments(obs_space.shape, scaled=float_entries(obs_space))
    rms.update(x)
    out = rms.normalize(x, 10.0)
    assert torch.equal(out[:, :3], x[:, :3]) and set(out[:, :3].unique().tolist()) == {0.0, 1.0}  # the one-hot
    assert abs(float(out[:, 3:].mean())) < 0.1 and abs(float(out[:, 3:].std()) - 1) < 0.1  # the vector, mean ~3
    cartpole, _ = env_spaces(EnvConfig(id="CartPole-v1"))
    assert float_entries(cartpole) is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_masked_actions_are_never_taken_and_the_best_legal_one_is_learned(folder):
    """The env raises on an illegal action, so a run that took one fails: PPO with masks from action_masks(), a
    recurrent PPO on the Dict observation's action_mask key, and DQN (greedy, random draws and targets masked)."""
    common = ["env.imports=[spaces_envs]", "seed=1", "eval.episodes=4", "eval.num_envs=2", "total_steps=2048"]
    runs = {
        "ppo_method": ["env.id=MaskedMethod-v0", "env.num_envs=4", "algo.num_steps=32"],
        "lstm_dict": [
            "env.id=Masked-v0",
            "model=lstm",
            "env.num_envs=4",
            "algo.num_steps=32",
            "algo.num_minibatches=2",
        ],
        "dqn_dict": ["algo=dqn", "env.id=Masked-v0", "env.num_envs=1", "algo.learning_starts=200", "algo.train_freq=1"],
    }
    for name, args in runs.items():
        run = folder / name
        out = rlrun("train", *common, *args, f"hydra.run.dir={run}", cwd=folder)
        assert out.returncode == 0, out.stderr[-2000:]
        assert _final(run) >= 10.0, (name, _final(run))  # best legal play 12, random legal play 6


def test_multi_action_distributions_match_torch_distributions():
    """Log-probs and entropies of independent categoricals and Bernoullis, summed over components, against
    torch.distributions; masked logits (-1e9) give illegal actions probability 0 and no entropy."""
    from torch.distributions import Bernoulli, Categorical

    from rlrun.models import distributions as D

    torch.manual_seed(0)
    logits, sizes = torch.randn(5, 7), [3, 4]
    actions = D.multi_categorical_sample(logits, sizes)
    log_prob, entropy = D.multi_categorical_log_prob_entropy(logits, sizes, actions)
    parts = [Categorical(logits=x) for x in logits.split(sizes, -1)]
    assert torch.allclose(log_prob, sum(d.log_prob(actions[:, i]) for i, d in enumerate(parts)))
    assert torch.allclose(entropy, sum(d.entropy() for d in parts))
    bits = torch.randn(5, 4)
    b = D.bernoulli_sample(bits)
    log_prob, entropy = D.bernoulli_log_prob_entropy(bits, b)
    assert torch.allclose(log_prob, Bernoulli(logits=bits).log_prob(b.float()).sum(-1))
    assert torch.allclose(entropy, Bernoulli(logits=bits).entropy().sum(-1))
    masked = torch.tensor([[0.3, -1e9, 0.1]])
    assert D.categorical_entropy(torch.log_softmax(masked, -1)).isfinite().all()
    assert (D.categorical_sample(torch.log_softmax(masked.expand(1000, 3), -1)) != 1).all()
