"""The statistics `rlrun report` draws on, after Agarwal et al. 2021, "Deep RL at the edge of the statistical
precipice" (the rliable protocol): interquartile mean, stratified bootstrap confidence intervals, probability of
improvement, performance profiles. Pure numpy functions on arrays of final scores or curves."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def interquartile_mean(values: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """Mean of the middle 50% along `axis`: the sorted values without the lowest and highest n // 4 (whole values,
    as scipy.stats.trim_mean(x, 0.25), which rliable uses; all of them when n < 4). NaN for no values."""
    v = np.sort(np.asarray(values, dtype=float), axis=axis)
    n = v.shape[axis]
    if n == 0:
        return float("nan")
    cut = n // 4
    mean: np.ndarray = np.take(v, np.arange(cut, n - cut), axis=axis).mean(axis=axis)
    return mean


def bootstrap_ci(
    strata: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    rng: np.random.Generator,
    reps: int = 2000,
    level: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile confidence interval of `statistic` by stratified bootstrap: each stratum (one group's runs on one
    env, [n_i, ...]) is resampled with replacement along its first axis, independently of the others, `reps` times;
    `statistic(*resampled)` maps the resampled strata, [reps, n_i, ...] each, to [reps, ...] estimates. A stratum of
    one run gives no spread (the interval is the point); an empty stratum gives NaN."""
    if any(len(s) == 0 for s in strata):
        return np.array(np.nan), np.array(np.nan)
    resampled = [np.asarray(s)[rng.integers(0, len(s), size=(reps, len(s)))] for s in strata]
    estimates = statistic(*resampled)
    low, high = np.percentile(estimates, [50 * (1 - level), 50 * (1 + level)], axis=0)
    return low, high


def mann_whitney(x: np.ndarray, y: np.ndarray) -> np.ndarray | float:
    """P(X > Y) + P(X = Y) / 2 over all pairs of a run of x and a run of y: the Mann-Whitney U statistic over
    n * m. x [..., n], y [..., m] (leading axes are batched, as a bootstrap's)."""
    xs, ys = np.asarray(x)[..., :, None], np.asarray(y)[..., None, :]
    u: np.ndarray = (xs > ys).mean(axis=(-2, -1)) + 0.5 * (xs == ys).mean(axis=(-2, -1))
    return u


def probability_of_improvement(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> np.ndarray | float:
    """P(X > Y), the probability that a run of X scores above a run of Y on a random env of the set (Agarwal et
    al. 2021, section 4.3): the mean over envs of the Mann-Whitney statistic. xs[e], ys[e]: the scores of X and Y on
    env e, [..., n_e] and [..., m_e]."""
    p: np.ndarray | float = np.mean([mann_whitney(x, y) for x, y in zip(xs, ys, strict=True)], axis=0)
    return p


def performance_profile(scores: Sequence[np.ndarray], taus: np.ndarray) -> np.ndarray:
    """Fraction of runs whose (normalized) score is above each tau, each env weighing the same (Agarwal et al.
    2021, section 4.2; equal to rliable's fraction over all runs when every env has as many runs). scores[e]:
    [..., n_e]; returns [..., len(taus)]."""
    fractions: np.ndarray = np.mean([(np.asarray(s)[..., :, None] > taus).mean(axis=-2) for s in scores], axis=0)
    return fractions


def min_max_normalize(scores: np.ndarray, low: float, high: float) -> np.ndarray:
    """(scores - low) / (high - low); all ones when high == low (every run scored the best there is)."""
    if high <= low:
        return np.ones_like(scores, dtype=float)
    return (np.asarray(scores, dtype=float) - low) / (high - low)


def align_curves(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], max_points: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """Curves (x, y) of several runs on one x grid, by linear interpolation: the x values they logged (at most
    `max_points` of them, else evenly spaced) from the latest first x to the earliest last x, where every run has
    data. Runs that do not overlap meet at the earliest last x. Returns grid [G] and values [runs, G]."""
    low = max(float(x[0]) for x, _ in curves)
    high = min(float(x[-1]) for x, _ in curves)
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    grid = grid[(grid >= low) & (grid <= high)]
    if len(grid) == 0:
        grid = np.array([high])
    elif len(grid) > max_points:
        grid = np.linspace(grid[0], grid[-1], max_points)
    return grid, np.stack([np.interp(grid, x, y) for x, y in curves])
