"""Any environment a researcher brings (issue 33): presets that apply only to the env they were tuned for,
errors that name the real cause, every gymnasium observation and action space the algorithms take, on real
third-party envs (the `envs` extra: Box2D, MiniGrid) and small envs written here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from rlrun.compose.preflight import preflight
from rlrun.compose.store import register_configs
from rlrun.errors import UserError
from tests.conftest import DATA, rlrun

register_configs()
SPACES_ENVS = DATA / "spaces_envs.py"

PRESETS = [
    ([], None),  # CartPole's own tuned PPO
    (["env.id=LunarLander-v3"], "~tuned"),  # not CartPole's preset on another env
    (["algo=dqn", "env.id=Acrobot-v1"], "~tuned"),
    (["env=lunarlander"], None),  # rl-zoo3's LunarLander PPO
    (["algo=dqn", "env=taxi"], None),  # measured on Taxi-v4
    (["algo=dqn", "env=taxi", "env.id=CliffWalking-v1"], "~tuned"),
    (["env=minigrid"], None),  # measured on MiniGrid-Empty-5x5's Dict observations
    (["env=minigrid", "env.id=MiniGrid-DoorKey-5x5-v0"], "~tuned"),
    (["algo=sac", "env.id=MountainCarContinuous-v0"], "tuned=sac_default"),  # SB3's defaults for any Box env
    (["algo=td3", "env=pendulum", "env.id=MountainCarContinuous-v0"], "tuned=td3_default"),
    (["algo=sac", "env=pendulum"], None),
    (["env=breakout", "env.id=ALE/Pong-v5"], None),  # the Atari presets are for every game
    (["env.id=Acrobot-v1", "tuned=ppo_cartpole"], None),  # chosen on the command line: kept
]


@pytest.mark.parametrize("args, added", PRESETS, ids=[" ".join(a) or "defaults" for a, _ in PRESETS])
def test_a_tuned_preset_applies_only_to_the_env_it_was_tuned_for(args, added):
    out = preflight("train", args).args
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


@pytest.fixture
def folder(tmp_path):
    shutil.copy(SPACES_ENVS, tmp_path)  # env.imports=[spaces_envs] finds it in the working directory
    return tmp_path


def _final(run) -> float:
    return json.loads((run / "summary.json").read_text())["eval_return_mean"]


ERRORS = [
    (["env.id=CartPole-v1", "+env.kwargs.colour=1"], "cannot make env 'CartPole-v1' with env.kwargs={'colour': 1}"),
    (["env.id=Notes-v0"], "Notes-v0's observation key 'note' (Text) cannot be encoded for a network; drop it with"),
    (["env.id=Notes-v0", "env.obs_keys=[pos,size]"], "env.obs_keys: Notes-v0's observations have no key 'size'"),
    (  # a Tuple's parts are picked by position
        ["env.id=Blackjack-v1", "env.obs_keys=[pos]"],
        "env.obs_keys: Blackjack-v1's observations have no key 'pos'; they have ['0', '1', '2']",
    ),
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


class ReadsTuple(torch.nn.Module):
    """A user's actor-critic for Blackjack's Tuple observation, which keeps what it was given."""

    seen: dict = {}

    def __init__(self, observation_space, action_space):
        super().__init__()
        assert list(observation_space.spaces) == ["0", "1", "2"], observation_space
        self.out = torch.nn.Linear(1, action_space.n)

    def forward(self, obs):
        ReadsTuple.seen = obs
        return self.out(obs["0"][:, None].float()), obs["1"].float()


class PrefersZero(torch.nn.Module):
    """A user's Q-network whose best action is always 0, which Masked-v0 makes illegal every other step or so."""

    def __init__(self, observation_space, action_space):
        super().__init__()
        self.keys = sorted(observation_space.spaces)
        self.bias = torch.nn.Parameter(torch.tensor([2.0, 1.0, 0.0]))

    def forward(self, obs):
        assert sorted(obs) == self.keys and obs["action_mask"].shape[1:] == (3,), obs
        return self.bias.expand(len(obs["pos"]), 3)


def test_users_networks_get_tuple_observations_as_keys_and_their_q_values_masked(folder, monkeypatch):
    """A Tuple observation (Blackjack's three Discretes) reaches a user's network as keys "0", "1", "2" of int64
    values, as the env gives them; a user's DQN network on an env with masks in its Dict observation gets the
    action_mask key too, and its greedy and epsilon-random actions are legal ones (rlrun masks its Q-values; the
    env raises on an illegal action)."""
    from rlrun.algos import ALGORITHMS, build_algo
    from rlrun.algos.protocol import EnvSpec
    from rlrun.config import EnvConfig, ModelConfig
    from rlrun.envs import env_spaces, make_env

    monkeypatch.chdir(folder)
    cpu = torch.device("cpu")
    cfg = EnvConfig(id="Blackjack-v1")
    obs_space, action_space = env_spaces(cfg)
    ppo = build_algo(
        ALGORITHMS["ppo"].schema(),
        ModelConfig(_target_="tests.runs.test_any_env.ReadsTuple"),
        EnvSpec(obs_space, action_space, 1),
        cpu,
    )
    env = make_env(cfg, train=False)()
    obs, _ = env.reset(seed=0)
    ppo.act(obs[None], deterministic=True)
    seen = ReadsTuple.seen
    assert [seen[k].tolist() for k in "012"] == [[int(v)] for v in env.unwrapped._get_obs()]
    assert all(seen[k].dtype == torch.int64 for k in "012")

    cfg = EnvConfig(id="Masked-v0", imports=["spaces_envs"])
    obs_space, action_space = env_spaces(cfg)
    dqn = build_algo(
        ALGORITHMS["dqn"].schema(buffer_size=64),
        ModelConfig(_target_="tests.runs.test_any_env.PrefersZero"),
        EnvSpec(obs_space, action_space, 1),
        cpu,
    )
    env = make_env(cfg, train=False)()
    obs, _ = env.reset(seed=0)
    taken = []
    for t in range(64):
        (action,) = dqn.act(obs[None], deterministic=t % 2 == 0)
        taken.append(int(action))
        obs, *_, truncated, _ = env.step(int(action))  # raises on an illegal action
        if truncated:
            obs, _ = env.reset()
    assert taken.count(0) > 10 and taken.count(1) > 10, taken  # 0 where legal, else the best legal one


def _completed(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed", summary


@pytest.mark.slow
@pytest.mark.timeout(600)  # 7 CLI runs; a machine at load 16 took 400 s to reach the second play
def test_each_space_trains_to_the_end_and_plays(folder):
    """Short runs of what bench/learning/test_any_env_learning.py trains to a score: masks in a Dict observation
    with an LSTM and from action_masks() with DQN (the env raises on an illegal action, so a run that took one
    fails), a user's network reading a Dict's keys (it asserts their dtypes and shapes) with PPO and DQN, Taxi's
    Discrete observations (frames in height-width-channel layout: the CarRacing test). `rlrun play` of the masked
    Dict run and of the user's DQN run, both on envs registered through env.imports."""
    common = ["env.imports=[spaces_envs]", "seed=1", "eval.episodes=2", "eval.num_envs=1"]
    short = ["env.num_envs=2", "algo.num_steps=32", "total_steps=128"]
    dqn = ["algo=dqn", "env.num_envs=1", "algo.learning_starts=32", "algo.train_freq=1", "total_steps=96"]
    user = ["env.id=Compass-v0", "model._target_=spaces_envs.CompassNet"]
    runs = {
        "masked_lstm": ["env.id=Masked-v0", "model=lstm", "algo.num_minibatches=2", *short],
        "masked_dqn": [*dqn, "env.id=MaskedMethod-v0"],
        "user_ppo": [*user, *short],
        "user_dqn": [*dqn, *user, "+model.kwargs.q=true"],
        "taxi": ["env.id=Taxi-v4", *short],
    }
    for name, args in runs.items():
        out = rlrun("train", *common, *args, f"hydra.run.dir={folder / name}", cwd=folder, timeout=200)
        assert out.returncode == 0, (name, out.stderr[-2000:])
        _completed(folder / name)
    for name in ("masked_lstm", "user_dqn"):
        out = rlrun("play", f"checkpoint={folder / name}", "episodes=2", cwd=folder, timeout=200)
        assert out.returncode == 0 and "mean" in out.stdout, (name, out.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_car_racing_frames_train_with_ppo_and_with_sac_on_a_replay_of_bytes(tmp_path):
    """CarRacing-v3 (uint8 frames [96, 96, 3], Box actions) runs to the end with PPO (the Nature CNN on [3, 96, 96])
    and SAC, whose replay keeps the frames as bytes: 27,648 a row, 4x less than float32."""
    from rlrun.algos import ALGORITHMS, build_algo
    from rlrun.algos.protocol import EnvSpec
    from rlrun.config import EnvConfig, ModelConfig
    from rlrun.envs import env_spaces

    obs_space, action_space = env_spaces(EnvConfig(id="CarRacing-v3"))
    assert obs_space.shape == (3, 96, 96) and obs_space.dtype == np.uint8
    sac = build_algo(
        ALGORITHMS["sac"].schema(buffer_size=1000),
        ModelConfig(),
        EnvSpec(obs_space, action_space, 1),
        torch.device("cpu"),
    )
    frames = sac.replay.frames
    assert frames.dtype == np.uint8 and frames[0].nbytes == 3 * 96 * 96 and len(frames) >= 1000
    common = ["env.id=CarRacing-v3", "env.max_episode_steps=50", "eval.episodes=1", "eval.num_envs=1", "seed=1"]
    common += ["threads=1"]  # the other pytest worker has the other core (a CNN run takes them all by default)
    runs = {
        "ppo": ["env.num_envs=2", "algo.num_steps=32", "algo.num_minibatches=2", "total_steps=128"],
        # 32 updates of small batches: SAC's three MLPs on 27,648 inputs are what costs here
        "sac": [
            "algo=sac",
            "algo.buffer_size=1000",
            "algo.learning_starts=96",
            "algo.batch_size=32",
            "total_steps=128",
        ],
    }
    for name, args in runs.items():
        out = rlrun("train", *common, *args, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path, timeout=300)
        assert out.returncode == 0, (name, out.stderr[-2000:])
        _completed(tmp_path / name)
