"""`rlrun report PATH [PATH ...]`: the runs under one or more folders (sweeps, single runs), summarized for a paper.
Per env, runs are grouped by their overrides minus the seed and labelled by the overrides that tell the groups
apart; each env gets a table (IQM with a 95% stratified bootstrap CI, mean, median, best, steps, wall, SPS) and a
panel of learning curves with a bootstrap band, and `--compare A B` gives the probability of improvement (the
statistics are in rlrun/stats.py). Everything is printed and written to report.md and PNGs."""

from __future__ import annotations

import json
import logging
import math
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from rlrun.errors import UserError
from rlrun.run_folder import abandoned
from rlrun.run_record import recorded_overrides
from rlrun.stats import (
    align_curves,
    bootstrap_ci,
    interquartile_mean,
    min_max_normalize,
    performance_profile,
    probability_of_improvement,
)

METRICS = {"eval": "eval/return_mean", "train": "charts/episodic_return"}  # --metric: the metrics.jsonl key
X_AXES = ("steps", "wall")
# No part of what a group is: the seed, where a run resumed from, and what never changes what trains (how it logs and
# when it checkpoints: a sweep resumed with `logging.progress=none` adds it to the jobs that start then).
IGNORED = ("seed=", "hydra.", "hydra/", "+sweep=", "resume=", "logging.", "checkpoint.")
ENV_CHOICE = ("env=", "env.id=")  # the env's panel and table name it already
DEFAULTS = "defaults"  # the label of a group with no override of its own
SEED, REPS = 0, 2000  # the bootstrap's: the same runs give the same report
# Fewer runs than this make a bootstrap interval (and a probability of improvement) look far surer than it is:
# rliable's guidance is 5-10 runs per group (Agarwal et al. 2021). Below it the report shows no interval.
MIN_RUNS = 5
log = logging.getLogger("rlrun")


@dataclass
class Run:
    path: Path
    overrides: list[str]
    status: str  # completed | failed | interrupted | running (no summary yet) | killed (no summary, no live job)
    summary: dict[str, Any]
    env_id: str
    algo: str
    curves: dict[str, tuple[np.ndarray, np.ndarray]]  # metric -> (env_steps [T], return [T])

    def score(self, metric: str) -> float | None:
        """The final return of a completed run: its final evaluation, or its last logged training episodes."""
        if self.status != "completed":
            return None
        if metric == "eval":
            value = self.summary.get("eval_return_mean")
        else:
            value = self.curves["train"][1][-1] if "train" in self.curves else None
        return None if value is None or math.isnan(value) else float(value)

    def curve(self, metric: str, x: str) -> tuple[np.ndarray, np.ndarray] | None:
        curve = self.curves.get(metric)
        if curve is None or x == "steps":
            return curve
        # metrics.jsonl holds no clock (only what a seeded run reproduces): the wall time at a point is estimated
        # at the run's mean rate, from summary.json.
        steps, wall = self.summary.get("env_steps"), self.summary.get("wall_seconds")
        return (curve[0] * wall / steps, curve[1]) if steps and wall is not None else None


@dataclass
class Group:
    """The runs of one env with the same overrides apart from the seed."""

    env_id: str
    overrides: frozenset[str]  # without seed, hydra's and the env choice
    runs: list[Run]
    label: str = ""  # the overrides that differ from the env's other groups (group_runs sets it)

    def scores(self, metric: str) -> np.ndarray:
        values = [r.score(metric) for r in self.runs]
        return np.array([v for v in values if v is not None], dtype=float)

    def row(self, metric: str) -> dict[str, Any]:
        """The group's line of its env's table: the statistics of its completed runs' final scores."""
        scores = self.scores(metric)
        done = [r.summary for r in self.runs if r.status == "completed"]
        low, high = bootstrap_ci([scores], lambda s: interquartile_mean(s, axis=-1), np.random.default_rng(SEED), REPS)
        return {
            "env": self.env_id,
            "group": self.label,
            "runs": len(self.runs),
            "failed": sum(r.status == "failed" for r in self.runs),
            "scored": len(scores),
            "iqm": float(interquartile_mean(scores)),
            "ci_low": float(low),
            "ci_high": float(high),
            "mean": float(scores.mean()) if len(scores) else math.nan,
            "median": float(np.median(scores)) if len(scores) else math.nan,
            "best": float(scores.max()) if len(scores) else math.nan,
            "steps": _mean([s.get("env_steps") for s in done]),
            "wall_s": _mean([s.get("wall_seconds") for s in done]),
            "sps": _mean([s.get("sps") for s in done]),
        }


def _mean(values: list[float | None]) -> float:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else math.nan


def _seed(run: Run) -> object:
    """A run's seed: its summary's, or for a run without one in its summary (failed early) its composed config's."""
    if "seed" in run.summary:
        return run.summary["seed"]
    try:
        return yaml.safe_load((run.path / ".hydra" / "config.yaml").read_text())["seed"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return "?"


def _repeated_seeds(groups: list[Group]) -> list[str]:
    """A warning for each group whose completed runs share a seed: its statistics count them as independent runs."""
    warnings = []
    for g in groups:
        seeds = [_seed(r) for r in g.runs if r.status == "completed"]
        twice = sorted({str(s) for s in seeds if seeds.count(s) > 1 and s != "?"})
        if twice:
            warnings.append(
                f"warning: {g.label} ({g.env_id}) has more than one completed run of seed {', '.join(twice)}: its "
                "statistics count them as independent runs"
            )
    return warnings


def _env_and_algo(folder: Path, summary: dict[str, Any]) -> tuple[str, str]:
    """From summary.json, or for a run without one (running, or failed early) from its composed config."""
    if "env_id" in summary:
        return summary["env_id"], summary.get("algo", "?")
    try:
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        return str(config["env"]["id"]), str(config["algo"]["name"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return "unknown env", "?"


def _curves(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    path = folder / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written by a running job
            continue
    curves = {}
    for metric, key in METRICS.items():
        points = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None and not math.isnan(r[key])]
        if points:
            steps, values = zip(*points)
            curves[metric] = np.array(steps, dtype=float), np.array(values, dtype=float)
    return curves


def load_run(folder: Path) -> Run:
    summary_path = folder / "summary.json"
    summary, status = {}, "killed" if abandoned(folder) else "running"
    if summary_path.exists():
        try:
            summary = json.loads(summary_path.read_text())
            if not isinstance(summary, dict):
                raise ValueError("not a JSON object")
            status = summary.get("status", "failed")
        except (json.JSONDecodeError, ValueError) as e:
            summary, status = {"error": f"unreadable summary.json: {e}"}, "failed"
            log.warning("%s: unreadable summary (%s); counted as failed", summary_path, e)
    env_id, algo = _env_and_algo(folder, summary)
    return Run(folder, recorded_overrides(folder, summary), status, summary, env_id, algo, _curves(folder))


def find_runs(roots: Sequence[Path]) -> list[Run]:
    """Every run folder under the roots: one with a summary.json, or a job still running (.hydra/, metrics)."""
    folders: set[Path] = set()
    for root in roots:
        if not root.is_dir():
            raise UserError(f"report: {root} is not a folder (give multirun folders or folders of run folders)")
        found = {p.parent for p in root.rglob("summary.json")} | {p.parent for p in root.rglob(".hydra")}
        folders |= {f.resolve() for f in found if (f / "summary.json").exists() or (f / "metrics.jsonl").exists()}
    if not folders:
        where = ", ".join(str(r) for r in roots)
        raise UserError(f"report: no runs under {where} (looked for run folders with summary.json or metrics.jsonl)")
    return [load_run(f) for f in sorted(folders)]


def group_runs(runs: list[Run], metric: str = "eval") -> list[Group]:
    """Groups per env (envs by name), best IQM first, each labelled by the overrides that set it apart from the
    other groups of its env (or, alone in its env, from every group of the report); "defaults" when none do."""
    groups: dict[tuple[str, frozenset[str]], Group] = {}
    for run in runs:
        key = frozenset(o for o in run.overrides if not o.startswith(IGNORED + ENV_CHOICE))
        groups.setdefault((run.env_id, key), Group(run.env_id, key, [])).runs.append(run)
    ordered = []
    for env_id in sorted({env for env, _ in groups}):
        members = [g for (env, _), g in groups.items() if env == env_id]
        shared = shared_overrides(list(groups.values()), env_id)
        for g in members:
            g.label = " ".join(sorted(g.overrides - shared)) or DEFAULTS
        iqm = {id(g): interquartile_mean(g.scores(metric)) for g in members}
        ordered += sorted(members, key=lambda g: -iqm[id(g)] if not math.isnan(iqm[id(g)]) else math.inf)
    return ordered


def shared_overrides(groups: list[Group], env_id: str) -> frozenset[str]:
    """The overrides every group of the env has; for a lone group, those every group of the report has."""
    members = [g for g in groups if g.env_id == env_id]
    return frozenset.intersection(*(g.overrides for g in (members if len(members) > 1 else groups)))


def _num(value: float, fmt: str = "{:.2f}") -> str:
    return "-" if math.isnan(value) else fmt.format(value)


def _iqm_cell(row: dict[str, Any]) -> str:
    if row["scored"] == 1:
        return f"{row['iqm']:.2f} (1 run: no CI)"
    if 1 < row["scored"] < MIN_RUNS:
        return f"{row['iqm']:.2f} ({_too_few(row['scored'])})"
    return "-" if row["scored"] == 0 else f"{row['iqm']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def _too_few(n: int) -> str:
    return f"n={n}: interval not meaningful"


COLUMNS = ("group", "runs", "failed", "IQM [95% CI]", "mean", "median", "best", "steps", "wall s", "SPS")


def _cells(row: dict[str, Any]) -> list[str]:
    return [
        row["group"],
        str(row["runs"]),
        str(row["failed"]),
        _iqm_cell(row),
        *(_num(row[k]) for k in ("mean", "median", "best")),
        _num(row["steps"], "{:.0f}"),
        _num(row["wall_s"], "{:.1f}"),
        _num(row["sps"], "{:.0f}"),
    ]


@dataclass
class Comparison:
    """A against B on the envs where both have completed runs (xs[e], ys[e]: their final scores on envs[e])."""

    a: str
    b: str
    envs: list[str]
    xs: list[np.ndarray]
    ys: list[np.ndarray]
    poi: float  # P(A > B)
    poi_low: float
    poi_high: float
    per_env: list[dict[str, Any]]  # IQMs, their difference with its CI, P(A > B) there


def _iqm_difference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return interquartile_mean(x, axis=-1) - interquartile_mean(y, axis=-1)


def compare(a: str, b: str, groups: list[Group], metric: str) -> Comparison:
    """A against B (group labels or folders): P(A > B) over the envs where both have completed runs, with its
    stratified bootstrap CI, and per env the IQMs, their difference with its CI, and P(A > B) there."""
    scores_a, scores_b = _side(a, groups, metric), _side(b, groups, metric)
    envs = [e for e in scores_a if len(scores_a[e]) and e in scores_b and len(scores_b[e])]
    if not envs:
        raise UserError(
            f"report: --compare: {a} and {b} have no env where both have completed runs "
            f"({a}: {', '.join(scores_a) or 'none'}; {b}: {', '.join(scores_b) or 'none'})"
        )
    xs, ys = [scores_a[e] for e in envs], [scores_b[e] for e in envs]
    k = len(envs)
    rng = np.random.default_rng(SEED)
    low, high = bootstrap_ci([*xs, *ys], lambda *s: probability_of_improvement(s[:k], s[k:]), rng, REPS)
    per_env = []
    for env, x, y in zip(envs, xs, ys):
        d_low, d_high = bootstrap_ci([x, y], _iqm_difference, rng, REPS)
        per_env.append(
            {
                "env": env,
                "runs_a": len(x),
                "runs_b": len(y),
                "iqm_a": float(interquartile_mean(x)),
                "iqm_b": float(interquartile_mean(y)),
                "diff": float(_iqm_difference(x, y)),
                "diff_low": float(d_low),
                "diff_high": float(d_high),
                "poi": float(probability_of_improvement([x], [y])),
            }
        )
    poi = float(probability_of_improvement(xs, ys))
    return Comparison(a, b, envs, xs, ys, poi, float(low), float(high), per_env)


def _side(name: str, groups: list[Group], metric: str) -> dict[str, np.ndarray]:
    """Scores per env of a folder's runs, or of the groups with that label (the same label in several envs)."""
    if Path(name).is_dir():
        root = Path(name).resolve()
        by_env: dict[str, list[float]] = {}
        for g in groups:
            for run in g.runs:
                score = run.score(metric)
                if score is not None and run.path.is_relative_to(root):
                    by_env.setdefault(g.env_id, []).append(score)
        return {env: np.array(values) for env, values in by_env.items()}
    chosen = [g for g in groups if sorted(g.label.split()) == sorted(name.split())]
    if not chosen:
        labels = ", ".join(sorted({repr(g.label) for g in groups}))
        raise UserError(f"report: --compare: no group or folder {name!r}; the groups are: {labels}")
    return {g.env_id: g.scores(metric) for g in chosen}


COMPARE_COLUMNS = ("env", "runs A", "runs B", "IQM A", "IQM B", "IQM A - B [95% CI]", "P(A > B)")


def _compare_cells(row: dict[str, Any]) -> list[str]:
    fewest = min(row["runs_a"], row["runs_b"])  # an interval from fewer than MIN_RUNS a side is not shown, as the IQM's
    interval = f"({_too_few(fewest)})" if fewest < MIN_RUNS else f"[{row['diff_low']:+.2f}, {row['diff_high']:+.2f}]"
    diff = f"{row['diff']:+.2f} {interval}"
    return [
        row["env"],
        str(row["runs_a"]),
        str(row["runs_b"]),
        _num(row["iqm_a"]),
        _num(row["iqm_b"]),
        diff,
        f"{row['poi']:.2f}",
    ]


def _compare_line(c: Comparison) -> str:
    return (
        f"A = {c.a}, B = {c.b}: P(A > B) = {c.poi:.2f}, 95% CI [{c.poi_low:.2f}, {c.poi_high:.2f}], "
        f"over {_count(len(c.envs), 'env')} ({', '.join(c.envs)})"
    )


def _compare_warning(c: Comparison) -> str | None:
    """A warning when a side has fewer than MIN_RUNS runs on an env: P(A > B) from 3 runs against 3 can read 1.00
    with an interval of [1.00, 1.00]."""
    few = [row for row in c.per_env if min(row["runs_a"], row["runs_b"]) < MIN_RUNS]
    if not few:
        return None
    where = ", ".join(f"{row['env']}: {row['runs_a']} vs {row['runs_b']}" for row in few)
    return (
        f"warning: fewer than {MIN_RUNS} runs a side ({where}): this probability and its interval are not "
        f"meaningful; rliable's guidance is 5-10 runs per group"
    )


def _pyplot() -> Any:  # matplotlib.pyplot (untyped)
    try:
        import matplotlib
    except ImportError as e:
        raise UserError("report: the plots need matplotlib: pip install 'rlrun[report]'") from e
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def curves_figure(groups: list[Group], metric: str, x: str = "steps") -> Any:  # a matplotlib Figure, or None
    """One panel per env: per group, the IQM over seeds of the learning curves (each run interpolated on a common
    x grid) with a 95% bootstrap band; a marker with its interval where runs logged one point. The legend of each
    panel sits below it. None when no run has a curve to draw. A group's curve is made of its completed runs, or
    of its running ones while none has completed."""
    panels: dict[str, list[tuple[Group, list[tuple[np.ndarray, np.ndarray]]]]] = {}
    for g in groups:
        done = [c for r in g.runs if r.status == "completed" and (c := r.curve(metric, x)) is not None]
        curves = done or [c for r in g.runs if r.status == "running" and (c := r.curve(metric, x)) is not None]
        if curves:
            panels.setdefault(g.env_id, []).append((g, curves))
    if not panels:
        return None
    plt = _pyplot()
    from matplotlib.transforms import offset_copy

    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    legend = {id(g): f"{textwrap.fill(g.label, 60)} ({_legend_n(len(c))})" for m in panels.values() for g, c in m}
    # Each row is as tall as its axes plus its tallest legend, so that a long legend does not squash the axes.
    lines = [sum(legend[id(g)].count("\n") + 1 for g, _ in members) for members in panels.values()]
    heights = [3.2 + 0.2 * max(lines[r * cols : (r + 1) * cols]) for r in range(rows)]
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(5.5 * cols, sum(heights)),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": heights},
    )
    colors: dict[str, str] = {}  # a label keeps its colour in every panel
    for ax, (env_id, members) in zip(axes.flat, panels.items()):
        for g, curves in members:
            grid, ys = align_curves(curves)
            center = interquartile_mean(ys, axis=0)
            rng = np.random.default_rng(SEED)
            low, high = bootstrap_ci([ys], lambda s: interquartile_mean(s, axis=1), rng, REPS)
            color = colors.setdefault(g.label, f"C{len(colors) % 10}")
            if len(curves) < MIN_RUNS:  # the IQM alone: a band over so few runs would claim what they cannot show
                ax.plot(grid, center, "o" if len(grid) == 1 else "-", color=color, label=legend[id(g)])
            elif len(grid) == 1:
                yerr = [center - low, high - center]
                ax.errorbar(grid, center, yerr=yerr, fmt="o", color=color, capsize=4, label=legend[id(g)])
            else:
                ax.plot(grid, center, color=color, label=legend[id(g)])
                ax.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
        algos = sorted({r.algo for g, _ in members for r in g.runs})
        ax.set_title(f"{env_id} ({', '.join(algos)})")
        ax.set_xlabel("env steps" if x == "steps" else "wall seconds (at each run's mean SPS)")
        ax.set_ylabel(f"{'eval' if metric == 'eval' else 'training episode'} return: IQM, 95% CI (n >= {MIN_RUNS})")
        ax.grid(alpha=0.3)
        # Below the axes' tick labels and x label, however tall the axes end up.
        below = offset_copy(ax.transAxes, fig=fig, y=-38, units="points")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below, fontsize="small", frameon=False)
    for ax in axes.flat[len(panels) :]:
        fig.delaxes(ax)
    return fig


def _legend_n(n: int) -> str:
    return f"n={n}" if n >= MIN_RUNS or n == 1 else _too_few(n)


def profile_figure(c: Comparison) -> Any:  # a matplotlib Figure
    """Performance profiles of A and B over their common envs: the fraction of runs whose score, min-max
    normalized per env over A's and B's runs there, is above tau, with a 95% stratified bootstrap band."""
    plt = _pyplot()
    taus = np.linspace(0, 1, 101)
    normalized = []
    for x, y in zip(c.xs, c.ys):
        both = np.concatenate([x, y])
        normalized.append((min_max_normalize(x, both.min(), both.max()), min_max_normalize(y, both.min(), both.max())))
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for i, name in enumerate((c.a, c.b)):
        scores = [pair[i] for pair in normalized]
        low, high = bootstrap_ci(scores, lambda *s: performance_profile(s, taus), np.random.default_rng(SEED), REPS)
        ax.plot(taus, performance_profile(scores, taus), color=f"C{i}", label=name)
        ax.fill_between(taus, low, high, color=f"C{i}", alpha=0.2, linewidth=0)
    ax.set_xlabel("normalized score tau (min-max per env over both groups' runs)")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_title(f"performance profile over {len(c.envs)} envs")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small", frameon=False)
    return fig


def _save(fig: Any, path: Path) -> Path:  # fig: a matplotlib Figure
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight": the legends outside the axes stay in the file
    plt.close(fig)
    return path


def write_markdown(
    path: Path,
    roots: Sequence[Path],
    groups: list[Group],
    rows: list[dict[str, Any]],
    metric: str,
    comparison: Comparison | None,
    plots: dict[str, Path],
) -> None:
    """report.md: the table of each env, each group's full overrides in a collapsed list, the comparison, the runs
    not completed and the plots written."""
    lines = [
        f"# rlrun report: {', '.join(str(r) for r in roots)}",
        "",
        f"Final {metric} return of the completed runs per group of seeds. IQM: interquartile mean; 95% CI: "
        f"percentile interval of a bootstrap over the runs ({REPS} resamples, seed {SEED}), shown for groups of at "
        f"least {MIN_RUNS} runs (rliable's guidance: 5-10); over fewer it would look far surer than it is.",
    ]
    for env_id in dict.fromkeys(g.env_id for g in groups):
        lines += ["", f"## {env_id}", ""]
        shared = shared_overrides(groups, env_id)
        if shared:
            lines += [
                "Left out of the labels, as every group compared has them: "
                + " ".join(f"`{o}`" for o in sorted(shared)),
                "",
            ]
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows if row["env"] == env_id]
        lines += ["", "<details><summary>Full overrides of each group</summary>", ""]
        for g in (g for g in groups if g.env_id == env_id):
            full = [o for o in g.runs[0].overrides if not o.startswith("seed=")]
            seeds = ", ".join(str(_seed(r)) for r in g.runs)
            lines.append(f"- **{g.label}** (seeds {seeds}): `{' '.join(full) or '(none)'}`")
        lines += ["", "</details>"]
    if comparison is not None:
        lines += ["", "## Comparison", "", _compare_line(comparison), ""]
        warning = _compare_warning(comparison)
        lines += [f"**{warning}**", ""] if warning else []
        lines += ["| " + " | ".join(COMPARE_COLUMNS) + " |", "|" + "---|" * len(COMPARE_COLUMNS)]
        lines += ["| " + " | ".join(_compare_cells(row)) + " |" for row in comparison.per_env]
    problems = [r for g in groups for r in g.runs if r.status != "completed"]
    if problems:
        lines += ["", "## Runs not completed", ""]
        for r in problems:
            lines.append(f"- `{r.path}`: {r.status}" + (f": {r.summary['error']}" if r.summary.get("error") else ""))
    lines += [""] + [f"![{name}]({png.name})" for name, png in plots.items()]
    path.write_text("\n".join(lines) + "\n")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _print_tables(console: Console, groups: list[Group], rows: list[dict[str, Any]], metric: str) -> None:
    for env_id in dict.fromkeys(g.env_id for g in groups):
        members = [g for g in groups if g.env_id == env_id]
        shared = shared_overrides(groups, env_id)
        table = Table(
            title=f"{env_id}: {_count(sum(len(g.runs) for g in members), 'run')} in {_count(len(members), 'group')}, "
            f"final {metric} return",
            caption=f"every group also has: {' '.join(sorted(shared))}" if shared else None,
        )
        for column in COLUMNS:
            table.add_column(column, justify="left" if column == "group" else "right")
        for row in rows:
            if row["env"] == env_id:
                table.add_row(*_cells(row))
        console.print(table)


def _print_comparison(console: Console, c: Comparison) -> None:
    console.print(_compare_line(c))
    warning = _compare_warning(c)
    if warning:
        console.print(warning, style="bold yellow")
    table = Table()
    for column in COMPARE_COLUMNS:
        table.add_column(column, justify="left" if column == "env" else "right")
    for row in c.per_env:
        table.add_row(*_compare_cells(row))
    console.print(table)


def report(
    roots: Sequence[Path],
    metric: str = "eval",
    x: str = "steps",
    compare_with: tuple[str, str] | None = None,
    out: Path | None = None,
) -> list[dict[str, Any]]:
    """Print the tables (and the comparison), write report.md and the plots into `out` (by default the folder
    when one is given, else the current folder); returns the table rows, env by env, best first."""
    if metric not in METRICS or x not in X_AXES:
        raise UserError(f"report: --metric is one of {', '.join(METRICS)} and --x one of {', '.join(X_AXES)}")
    out = out or (roots[0] if len(roots) == 1 else Path.cwd())
    runs = find_runs(roots)
    groups = group_runs(runs, metric)
    # Before anything is printed or made: a --compare side that names nothing is one line, and no empty --out folder.
    comparison = compare(*compare_with, groups, metric) if compare_with else None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"report: cannot write the report into {out}: {e.strerror}") from e
    rows = [g.row(metric) for g in groups]
    # Files and pipes get whole labels; no markup: labels such as env.imports=[my_envs] are text, not style tags.
    console = Console(width=None if sys.stdout.isatty() else 200, markup=False)
    _print_tables(console, groups, rows, metric)
    for warning in _repeated_seeds(groups):
        console.print(warning, style="bold yellow")
    running = sum(r.status == "running" for r in runs)
    if running:
        console.print(
            f"{running} of {_count(len(runs), 'run')} still running: not counted in the tables until they finish"
        )
    stopped = {s: n for s in ("interrupted", "killed") if (n := sum(r.status == s for r in runs))}
    if stopped:  # (report.md lists them)
        which = ", ".join(
            f"{n} {s}" + (" (no summary.json, no live job)" if s == "killed" else "") for s, n in stopped.items()
        )
        console.print(
            f"not in the tables: {which}; continue each with rlrun train resume=FOLDER (report.md lists them)"
        )
    plots: dict[str, Path] = {}
    if comparison is not None:
        _print_comparison(console, comparison)
        if len(comparison.envs) > 1:
            plots["performance profile"] = _save(profile_figure(comparison), out / "performance_profile.png")
    fig = curves_figure(groups, metric, x)
    if fig is None:
        why = f"no run has {'an' if metric[0] in 'aeiou' else 'a'} {metric} return in its metrics.jsonl" + (
            " and a summary.json" if x == "wall" else ""
        )
        console.print(f"learning_curves.png not written: {why}")
    else:
        plots["learning curves"] = _save(fig, out / "learning_curves.png")
    write_markdown(out / "report.md", roots, groups, rows, metric, comparison, plots)
    console.print(f"wrote {', '.join(str(p) for p in [out / 'report.md', *plots.values()])}")
    return rows
