"""`rlrun report`: the statistics against hand-worked values, and reports over run folders written as training
writes them (summary.json, metrics.jsonl, .hydra/), through the CLI in this process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlrun.cli import main
from rlrun.report import compare, curves_figure, find_runs, group_runs, report
from rlrun.run_folder import held
from rlrun.stats import (
    align_curves,
    bootstrap_ci,
    interquartile_mean,
    mann_whitney,
    min_max_normalize,
    performance_profile,
    probability_of_improvement,
)

COMMON = ["total_steps=40000", "eval.episodes=10", "logging.progress=none", "hydra.launcher.n_jobs=2"]


def write_run(
    folder: Path,
    env: str,
    overrides: list[str],
    seed: int,
    returns: list[float],
    algo: str = "ppo",
    status: str = "completed",
) -> None:
    """A run folder as `rlrun train` leaves it: an eval every 10000 env steps (the last one the final eval), the
    training episodes logged in between; no summary.json while running."""
    (folder / ".hydra").mkdir(parents=True)
    all_overrides = [*overrides, f"seed={seed}"]
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(all_overrides))
    config = {"algo": {"name": algo, "lr": 0.00025}, "env": {"id": env, "num_envs": 8}, "seed": seed}
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for i, value in enumerate(returns, start=1):
        lines.append({"env_steps": 10000 * i - 5000, "charts/episodic_return": value * 0.9, "charts/episodes": 4})
        lines.append({"env_steps": 10000 * i, "charts/episodic_return": value, "eval/return_mean": value})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if status == "running":
        return
    summary = {
        "status": status,
        "algo": algo,
        "env_id": env,
        "seed": seed,
        "env_steps": 10000 * len(returns),
        "wall_seconds": 20.0 * len(returns),
        "sps": 500.0,
        "eval_return_mean": returns[-1] if status == "completed" else None,
        "overrides": all_overrides,
        "world_size": 1,
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))


def two_env_sweep(root: Path) -> Path:
    """CartPole with two configurations, Acrobot with the defaults; 3 seeds each; one CartPole run failed."""
    job = 0
    configs = [
        ("CartPole-v1", ["env=cartpole", "algo.lr=0.0003"], [100.0, 300.0, 480.0]),
        ("CartPole-v1", ["env=cartpole", "algo.lr=0.001", "algo.ent_coef=0.01"], [50.0, 150.0, 200.0]),
        ("Acrobot-v1", ["env=acrobot"], [-500.0, -200.0, -90.0]),
    ]
    for env, overrides, returns in configs:
        for seed in range(3):
            noisy = [r + 10.0 * seed for r in returns]
            write_run(root / str(job), env, [*COMMON, *overrides], seed, noisy)
            job += 1
    write_run(
        root / str(job),
        "CartPole-v1",
        [*COMMON, "env=cartpole", "algo.lr=0.001", "algo.ent_coef=0.01"],
        3,
        [10.0],
        status="failed",
    )
    return root


def test_interquartile_mean_of_eight_known_numbers():
    # Sorted: 0 1 3 4 6 8 9 10; the lowest and highest two dropped: (3 + 4 + 6 + 8) / 4 = 5.25.
    assert interquartile_mean(np.array([10, 0, 3, 8, 1, 9, 4, 6.0])) == 5.25
    assert interquartile_mean(np.array([1, 2, 3, 4, 100.0])) == 3.0  # n // 4 = 1 from each end: (2 + 3 + 4) / 3
    assert interquartile_mean(np.array([1.0, 2.0, 9.0])) == 4.0  # fewer than 4: all of them
    assert np.isnan(interquartile_mean(np.array([])))
    batched = interquartile_mean(np.array([[10, 0, 3, 8, 1, 9, 4, 6.0], [1, 1, 1, 1, 2, 2, 2, 2]]), axis=1)
    assert batched.tolist() == [5.25, 1.5]


def test_bootstrap_ci_covers_the_true_mean_at_the_stated_rate():
    rng = np.random.default_rng(1)
    trials, covered = 400, 0
    for _ in range(trials):
        sample = rng.normal(3.0, 2.0, size=40)
        low, high = bootstrap_ci([sample], lambda s: s.mean(axis=-1), rng, reps=1000)
        covered += low <= 3.0 <= high
    # 95% nominal; a percentile interval on 40 draws covers a little less. Binomial sd over 400 trials: 0.011.
    assert 0.90 <= covered / trials <= 0.98


def test_bootstrap_ci_of_one_run_is_the_point_and_of_none_nan():
    rng = np.random.default_rng(0)
    low, high = bootstrap_ci([np.array([7.0])], lambda s: interquartile_mean(s, axis=-1), rng)
    assert low == high == 7.0
    assert np.isnan(bootstrap_ci([np.array([])], lambda s: s.mean(axis=-1), rng)[0])


def test_bootstrap_resamples_each_stratum_on_its_own():
    # Two strata of constant values: whatever is drawn, the mean of their means is 2.5, so the interval is a point.
    strata = [np.full(5, 1.0), np.full(3, 4.0)]
    low, high = bootstrap_ci(strata, lambda a, b: (a.mean(-1) + b.mean(-1)) / 2, np.random.default_rng(0))
    assert low == high == 2.5


def test_probability_of_improvement_by_hand():
    # x = 1, 2, 3 against y = 2, 2: pairs won 2 (3 > 2 twice), tied 2 (2 = 2): (2 + 2 / 2) / 6 = 0.5.
    assert mann_whitney(np.array([1, 2, 3.0]), np.array([2, 2.0])) == 0.5
    # x = 3, 4 against y = 1, 2, 3: 3 wins 2 and ties 1, 4 wins 3: (5 + 0.5) / 6 = 11/12.
    assert mann_whitney(np.array([3, 4.0]), np.array([1, 2, 3.0])) == pytest.approx(11 / 12)
    xs, ys = [np.array([1, 2, 3.0]), np.array([3, 4.0])], [np.array([2, 2.0]), np.array([1, 2, 3.0])]
    assert probability_of_improvement(xs, ys) == pytest.approx((0.5 + 11 / 12) / 2)  # each env weighs the same


def test_performance_profile_and_normalization_by_hand():
    assert min_max_normalize(np.array([2, 4, 6.0]), 2, 6).tolist() == [0, 0.5, 1]
    assert min_max_normalize(np.array([5, 5.0]), 5, 5).tolist() == [1, 1]
    taus = np.array([0, 0.5, 0.99])
    # env 1: above 0: 2 of 3, above 0.5 and 0.99: 1 of 3; env 2: both runs above each tau.
    profile = performance_profile([np.array([0, 0.5, 1.0]), np.array([1, 1.0])], taus)
    assert profile == pytest.approx([(2 / 3 + 1) / 2, (1 / 3 + 1) / 2, (1 / 3 + 1) / 2])


def test_align_curves_interpolates_where_every_run_has_data():
    grid, ys = align_curves([(np.array([0, 10.0]), np.array([0, 1.0])), (np.array([0, 5, 10, 15.0]), np.arange(4.0))])
    assert grid.tolist() == [0, 5, 10] and ys.tolist() == [[0, 0.5, 1], [0, 1, 2]]
    grid, ys = align_curves([(np.array([4096.0]), np.array([9.0])), (np.array([4096.0]), np.array([11.0]))])
    assert grid.tolist() == [4096] and ys.tolist() == [[9], [11]]  # one final eval each: one point


def test_report_over_two_envs_and_three_groups(tmp_path):
    sweep = two_env_sweep(tmp_path / "sweep")
    rows = report([sweep])
    labels = {(row["env"], row["group"]) for row in rows}
    assert labels == {
        ("Acrobot-v1", "defaults"),
        ("CartPole-v1", "algo.lr=0.0003"),
        ("CartPole-v1", "algo.ent_coef=0.01 algo.lr=0.001"),
    }
    best = rows[1]  # envs by name, best first: CartPole's lr=3e-4 group before the other
    assert best["group"] == "algo.lr=0.0003" and best["runs"] == 3 and best["failed"] == 0
    assert best["iqm"] == pytest.approx(490.0) and best["median"] == 490.0 and best["best"] == 500.0
    assert best["ci_low"] >= 480.0 and best["ci_high"] <= 500.0 and best["ci_low"] < best["ci_high"]
    assert rows[2]["failed"] == 1 and rows[2]["runs"] == 4 and rows[2]["scored"] == 3

    fig = curves_figure(group_runs(find_runs([sweep])), "eval")
    assert len(fig.axes) == 2
    legends = {ax.get_title(): [t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes}
    assert legends == {
        "Acrobot-v1 (ppo)": ["defaults (n=3: interval not meaningful)"],
        "CartPole-v1 (ppo)": [
            "algo.lr=0.0003 (n=3: interval not meaningful)",
            "algo.ent_coef=0.01 algo.lr=0.001 (n=3: interval not meaningful)",
        ],
    }
    png = (sweep / "learning_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (sweep / "report.md").read_text()
    assert "| algo.lr=0.0003 | 3 | 0 | 490.00 (n=3: interval not meaningful) |" in markdown
    assert "total_steps=40000" in markdown and "<details>" in markdown  # the full overrides are kept
    assert not (sweep / "performance_profile.png").exists()


def test_runs_that_differ_only_in_how_they_log_and_checkpoint_form_one_group(tmp_path):
    """A sweep resumed with `logging.progress=none` gives that override to the jobs that first start then (and a
    user may checkpoint some seeds more often): the report still makes one group of the sweep."""
    for seed in range(6):
        extra = ["logging.progress=none", "checkpoint.every_steps=5000"] if seed >= 3 else []
        write_run(tmp_path / str(seed), "CartPole-v1", ["algo.lr=0.0003", *extra], seed, [400.0 + seed])
    write_run(tmp_path / "6", "CartPole-v1", ["algo.lr=0.001"], 6, [100.0])
    groups = group_runs(find_runs([tmp_path]))
    assert sorted((g.label, len(g.runs)) for g in groups) == [("algo.lr=0.0003", 6), ("algo.lr=0.001", 1)]


def test_compare_finds_a_clear_improvement_and_no_difference_between_equal_draws(tmp_path):
    rng = np.random.default_rng(3)
    for name, mean in (("better", 10.0), ("worse", 0.0), ("same", 0.0)):
        for env in ("CartPole-v1", "Acrobot-v1"):
            for seed in range(20):
                folder = tmp_path / name / env / str(seed)
                write_run(folder, env, [f"algo.vf_coef={name}"], seed, [float(rng.normal(mean, 1.0))])
    groups = group_runs(find_runs([tmp_path]))
    clear = compare("algo.vf_coef=better", "algo.vf_coef=worse", groups, "eval")
    assert clear.envs == ["Acrobot-v1", "CartPole-v1"] and clear.poi > 0.99 and clear.poi_low > 0.95
    assert all(row["diff"] == pytest.approx(10.0, abs=1.0) for row in clear.per_env)
    equal = compare(str(tmp_path / "same"), str(tmp_path / "worse"), groups, "eval")  # folders work too
    assert equal.poi == pytest.approx(0.5, abs=0.15) and equal.poi_low < 0.5 < equal.poi_high

    report([tmp_path], compare_with=("algo.vf_coef=better", "algo.vf_coef=worse"))
    assert (tmp_path / "performance_profile.png").exists()
    assert "P(A > B) = 1.00" in (tmp_path / "report.md").read_text()


def test_report_of_runs_with_one_eval_each_draws_markers(tmp_path):
    """A 2x2 sweep of short runs: one final eval each and no logged training episode."""
    for job, (env, lr) in enumerate([(e, lr) for e in ("CartPole-v1", "Acrobot-v1") for lr in ("0.1", "0.2")]):
        write_run(tmp_path / str(job), env, [f"algo.lr={lr}"], 1, [float(job)])
        (tmp_path / str(job) / "metrics.jsonl").write_text(
            json.dumps({"env_steps": 4096, "eval/return_mean": job}) + "\n"
        )
    fig = curves_figure(group_runs(find_runs([tmp_path])), "eval")
    assert len(fig.axes) == 2
    assert all(len(ax.lines) >= 2 for ax in fig.axes)  # a marker per group


def test_report_with_nothing_to_plot_writes_no_png_and_says_why(tmp_path, capsys):
    write_run(tmp_path / "0", "CartPole-v1", [], 1, [5.0])
    (tmp_path / "0" / "metrics.jsonl").write_text("")  # a run too short to log a line, say
    report([tmp_path])
    assert "learning_curves.png not written: no run has an eval return" in capsys.readouterr().out
    assert not (tmp_path / "learning_curves.png").exists()
    assert "learning_curves.png" not in (tmp_path / "report.md").read_text()


def test_a_seed_run_twice_in_a_group_is_warned_of_and_a_failed_runs_seed_is_its_configs(tmp_path, capsys):
    for i, seed in enumerate((0, 0, 1)):
        write_run(tmp_path / str(i), "CartPole-v1", ["algo.lr=0.1"], seed, [5.0 + i])
    write_run(tmp_path / "3", "CartPole-v1", ["algo.lr=0.1"], 7, [1.0], status="failed")
    summary = json.loads((tmp_path / "3" / "summary.json").read_text())
    del summary["seed"]  # as a run that failed before it trained writes it: its config has the seed
    (tmp_path / "3" / "summary.json").write_text(json.dumps(summary))
    report([tmp_path])
    out = capsys.readouterr().out
    assert "warning: defaults (CartPole-v1) has more than one completed run of seed 0" in out  # one group
    assert "(seeds 0, 0, 1, 7)" in (tmp_path / "report.md").read_text()


def test_labels_print_as_written_brackets_and_all(tmp_path, capsys):
    """Override values in brackets (lists) are labels, not the terminal library's style tags, which would drop them."""
    for i, sizes in enumerate(("[64,64]", "[128]")):
        write_run(tmp_path / str(i), "CartPole-v1", ["env.imports=[my_envs]", f"model.hidden_sizes={sizes}"], 1, [5.0])
    report([tmp_path])
    out = capsys.readouterr().out
    assert "model.hidden_sizes=[64,64]" in out and "model.hidden_sizes=[128]" in out
    assert "every group also has: env.imports=[my_envs]" in out


def test_report_of_several_folders_and_wall_time(tmp_path, capsys):
    write_run(tmp_path / "a" / "0", "CartPole-v1", ["algo.lr=0.1"], 1, [1.0, 2.0])
    write_run(tmp_path / "b" / "0", "CartPole-v1", ["algo.lr=0.2"], 1, [3.0, 4.0])
    write_run(tmp_path / "b" / "1", "CartPole-v1", ["algo.lr=0.2"], 2, [3.0], status="running")
    write_run(tmp_path / "b" / "2", "CartPole-v1", ["algo.lr=0.2"], 3, [3.0], status="running")
    with held(tmp_path / "b" / "1"):  # a live job holds its folder; b/2's was killed (no summary, no holder)
        main(
            ["report", str(tmp_path / "a"), str(tmp_path / "b"), "--x", "wall", "--out", str(tmp_path / "new" / "out")]
        )
    out = capsys.readouterr().out
    assert "algo.lr=0.1" in out and "algo.lr=0.2" in out and "1 of 4 runs still running" in out
    assert "not in the tables: 1 killed (no summary.json, no live job)" in out
    assert f"`{tmp_path / 'b' / '2'}`: killed" in (tmp_path / "new" / "out" / "report.md").read_text()
    assert (tmp_path / "new" / "out" / "report.md").exists()  # --out is made when missing
    fig = curves_figure(group_runs(find_runs([tmp_path])), "eval", x="wall")
    assert max(fig.axes[0].lines[0].get_xdata()) == 40.0  # 20000 env steps in 40 s


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing"], "report: missing is not a folder"),
        (["."], "report: no runs under"),
        (["run", "--metric", "loss"], "report: argument --metric: invalid choice: 'loss'"),
        (["run", "--compare", "algo.lr=0.3", "algo.lr=0.1"], "report: --compare: no group or folder 'algo.lr=0.3'"),
        (
            ["run", "--compare", "algo.lr=0.3", "algo.lr=0.1", "--out", "new"],
            "report: --compare: no group or folder 'algo.lr=0.3'",
        ),
        (["run", "--out", "run/0/summary.json/x"], "report: cannot write the report into run/0/summary.json/x"),
    ],
)
def test_bad_input_ends_with_one_line(tmp_path, monkeypatch, capsys, args, message):
    write_run(tmp_path / "run" / "0", "CartPole-v1", ["algo.lr=0.1"], 1, [1.0])
    write_run(tmp_path / "run" / "1", "CartPole-v1", ["algo.lr=0.2"], 1, [1.0])
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / ("empty" if args == ["."] else "."))
    with pytest.raises(SystemExit) as exit_:
        main(["report", *args])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"rlrun: error: {message}")
    assert not out and not (tmp_path / "new").exists()  # nothing printed before the line, no --out folder made


def test_report_marks_intervals_over_fewer_than_five_runs_as_not_meaningful(tmp_path, capsys):
    """2 seeds of one group, 6 of another: the table, report.md and the plot give the 2-seed group no interval and
    say why; the 6-seed group keeps its interval; --compare from 2 runs against 6 prints P(A > B) with a warning."""
    for seed in range(2):
        write_run(tmp_path / f"few{seed}", "CartPole-v1", ["algo.lr=0.1"], seed, [100.0 + seed, 200.0 + 10 * seed])
    for seed in range(6):
        write_run(tmp_path / f"many{seed}", "CartPole-v1", ["algo.lr=0.2"], seed, [50.0 + seed, 100.0 + seed])
    main(["report", str(tmp_path), "--compare", "algo.lr=0.1", "algo.lr=0.2"])
    out = capsys.readouterr().out
    assert "205.00 (n=2: interval not meaningful)" in out and "102.50 [" in out
    assert "P(A > B) = 1.00" in out and "warning: fewer than 5 runs a side (CartPole-v1: 2 vs 6)" in out
    assert "+102.50 (n=2: interval not meaningful)" in out  # the IQMs' difference, without an interval
    markdown = (tmp_path / "report.md").read_text()
    assert "| algo.lr=0.1 | 2 | 0 | 205.00 (n=2: interval not meaningful) |" in markdown
    assert "**warning: fewer than 5 runs a side" in markdown
    fig = curves_figure(group_runs(find_runs([tmp_path])), "eval")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "algo.lr=0.1 (n=2: interval not meaningful)",
        "algo.lr=0.2 (n=6)",
    ]
    assert len(ax.collections) == 1  # one band: the 6-run group's
