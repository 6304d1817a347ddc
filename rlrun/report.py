"""`rlrun report PATH`: summarize the run folders under PATH (a multirun folder, or any folder of runs).
Runs are grouped by their overrides minus the seed; each group gets a row (runs, failed, final eval mean +-
std, interquartile mean across seeds, best, steps, wall time, SPS), best first, in the terminal, in
PATH/report.md, and as learning curves with a band across seeds in PATH/learning_curves.png."""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from rlrun.errors import UserError

log = logging.getLogger("rlrun")
IGNORED = ("seed=", "hydra.", "hydra/", "+sweep=")


@dataclass
class Run:
    path: Path
    overrides: list[str]
    status: str  # completed | failed | interrupted | running (no summary yet)
    summary: dict = field(default_factory=dict)
    curve: tuple[np.ndarray, np.ndarray] | None = None  # (env_steps, return) for the learning-curve plot


@dataclass
class Group:
    name: str
    runs: list[Run]

    def finals(self) -> np.ndarray:
        values = [r.summary.get("eval_return_mean") for r in self.runs if r.status == "completed"]
        return np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)

    def row(self) -> dict:
        finals = self.finals()
        done = [r.summary for r in self.runs if r.status == "completed"]
        return {
            "group": self.name,
            "runs": len(self.runs),
            "failed": sum(r.status == "failed" for r in self.runs),
            "mean": float(finals.mean()) if len(finals) else math.nan,
            "std": float(finals.std()) if len(finals) else math.nan,
            "iqm": interquartile_mean(finals),
            "best": float(finals.max()) if len(finals) else math.nan,
            "steps": float(np.mean([s["env_steps"] for s in done])) if done else math.nan,
            "wall_s": float(np.mean([s["wall_seconds"] for s in done])) if done else math.nan,
            "sps": float(np.mean([s["sps"] for s in done if s.get("sps")])) if done else math.nan,
        }


def interquartile_mean(values: np.ndarray) -> float:
    """Mean of the middle 50% (Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice"):
    sorted values with the lowest and highest quarter dropped (whole values; all of them when fewer than 4)."""
    if len(values) == 0:
        return math.nan
    v = np.sort(values)
    cut = len(v) // 4
    return float(v[cut : len(v) - cut].mean())


def _overrides(folder: Path, summary: dict) -> list[str]:
    if summary.get("overrides") is not None:
        return list(summary["overrides"])
    saved = folder / ".hydra" / "overrides.yaml"
    return list(yaml.safe_load(saved.read_text()) or []) if saved.exists() else []


def _curve(folder: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """Eval return over env steps if the run evaluated at least twice, else the training episodic return."""
    path = folder / "metrics.jsonl"
    if not path.exists():
        return None
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written by a running job
            continue
    for key in ("eval/return_mean", "charts/episodic_return"):
        points = [(r["env_steps"], r[key]) for r in rows if key in r]
        if len(points) >= 2:
            steps, values = zip(*points)
            return np.array(steps, dtype=float), np.array(values, dtype=float)
    return None


def load_run(folder: Path) -> Run:
    summary_path = folder / "summary.json"
    if not summary_path.exists():
        return Run(folder, _overrides(folder, {}), "running", curve=_curve(folder))
    try:
        summary = json.loads(summary_path.read_text())
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
    except (json.JSONDecodeError, ValueError) as e:
        log.warning("%s: unreadable summary (%s); counted as failed", summary_path, e)
        return Run(folder, _overrides(folder, {}), "failed", {"error": f"unreadable summary.json: {e}"})
    return Run(folder, _overrides(folder, summary), summary.get("status", "failed"), summary, _curve(folder))


def find_runs(root: Path) -> list[Run]:
    """Every run folder under root: one with a summary.json, or a job still running (.hydra/, metrics)."""
    if not root.is_dir():
        raise UserError(f"report: {root} is not a folder (give a multirun folder or a folder of run folders)")
    folders = {p.parent for p in root.rglob("summary.json")} | {p.parent for p in root.rglob(".hydra")}
    folders = {f for f in folders if (f / "summary.json").exists() or (f / "metrics.jsonl").exists()}
    if not folders:
        raise UserError(f"report: no runs under {root} (looked for run folders with summary.json or metrics.jsonl)")
    return [load_run(f) for f in sorted(folders)]


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs with the same overrides apart from the seed form a group, named by the overrides that tell
    groups apart (those shared by every run say nothing); best IQM first."""
    keys = {id(r): frozenset(o for o in r.overrides if not o.startswith(IGNORED)) for r in runs}
    shared = frozenset.intersection(*keys.values()) if keys else frozenset()
    groups: dict[str, list[Run]] = {}
    for run in runs:
        name = " ".join(sorted(keys[id(run)] - shared)) or "(all runs)"
        groups.setdefault(name, []).append(run)
    ordered = [Group(name, members) for name, members in groups.items()]
    return sorted(ordered, key=lambda g: -g.row()["iqm"] if not math.isnan(g.row()["iqm"]) else math.inf)


COLUMNS = [
    ("group", "{}"),
    ("runs", "{}"),
    ("failed", "{}"),
    ("mean", "{:.2f}"),
    ("std", "{:.2f}"),
    ("iqm", "{:.2f}"),
    ("best", "{:.2f}"),
    ("steps", "{:.0f}"),
    ("wall_s", "{:.1f}"),
    ("sps", "{:.0f}"),
]


def _cells(row: dict) -> list[str]:
    out = []
    for key, fmt in COLUMNS:
        value = row[key]
        out.append("-" if isinstance(value, float) and math.isnan(value) else fmt.format(value))
    return out


def write_markdown(root: Path, groups: list[Group], runs: list[Run]) -> Path:
    lines = [f"# rlrun report: {root}", "", "Final eval return per group (mean +- std over seeds, IQM, best).", ""]
    lines += ["| " + " | ".join(k for k, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(g.row())) + " |" for g in groups]
    problems = [r for r in runs if r.status != "completed"]
    if problems:
        lines += ["", "## Runs not completed", ""]
        lines += [
            f"- `{r.path}`: {r.status}" + (f": {r.summary.get('error')}" if r.summary.get("error") else "")
            for r in problems
        ]
    lines += ["", "![learning curves](learning_curves.png)", ""]
    path = root / "report.md"
    path.write_text("\n".join(lines))
    return path


def plot_curves(root: Path, groups: list[Group]) -> tuple[Path, list[str]]:
    """Mean return vs env steps per group with a band (min..max across seeds); returns the labels drawn."""
    try:
        import matplotlib
    except ImportError as e:
        raise UserError("report: the plot needs matplotlib: pip install 'rlrun[report]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    labels = []
    for g in groups:
        curves = [r.curve for r in g.runs if r.curve is not None]
        if not curves:
            continue
        grid = np.unique(np.concatenate([steps for steps, _ in curves]))
        grid = grid[grid <= min(steps[-1] for steps, _ in curves)]  # where every seed has data
        if len(grid) < 2:
            continue
        ys = np.stack([np.interp(grid, steps, values) for steps, values in curves])
        (line,) = ax.plot(grid, ys.mean(0), label=f"{g.name} (n={len(curves)})")
        ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
        labels.append(g.name)
    ax.set_xlabel("env steps")
    ax.set_ylabel("return (eval if evaluated, else training episodes)")
    if labels:
        ax.legend(fontsize="small")
    path = root / "learning_curves.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path, labels


def report(root: Path) -> list[dict]:
    """Print the table, write report.md and learning_curves.png into root; returns the rows, best first."""
    runs = find_runs(root)
    groups = group_runs(runs)
    table = Table(title=f"{root}: {len(runs)} runs in {len(groups)} groups (final eval return)")
    for key, _ in COLUMNS:
        table.add_column(key, justify="left" if key == "group" else "right")
    for g in groups:
        table.add_row(*_cells(g.row()))
    console = Console(width=None if sys.stdout.isatty() else 200)  # files and pipes get whole group names
    console.print(table)
    md = write_markdown(root, groups, runs)
    png, _ = plot_curves(root, groups)
    console.print(f"wrote {md} and {png}")
    return [g.row() for g in groups]
