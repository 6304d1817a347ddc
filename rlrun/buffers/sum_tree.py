"""A batched sum tree (with a min tree beside it) over a fixed number of leaves: proportional sampling and
priority updates for a whole batch at once, one vectorized numpy step per tree level, no per-item loop."""

from __future__ import annotations

import numpy as np


class SumTree:
    """Leaves hold non-negative priorities; `total` is their sum and `min` the smallest positive one.

    Parents are recomputed from their children after every update rather than adjusted by deltas, so no
    rounding error accumulates however long training runs. Leaf i lives at node size + i of a complete
    binary tree (size = capacity rounded up to a power of two); node 1 is the root.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.size = 1 << max(0, (capacity - 1).bit_length())
        self.sums = np.zeros(2 * self.size)
        self.mins = np.full(2 * self.size, np.inf)  # zero leaves (not sampleable) count as +inf here

    @property
    def total(self) -> float:
        return float(self.sums[1])

    @property
    def min(self) -> float:
        """The smallest positive priority (inf when the tree is empty)."""
        return float(self.mins[1])

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        sums: np.ndarray = self.sums[self.size + np.asarray(index)]
        return sums

    def update(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Set leaves `index` to `priority` (arrays of one length). With repeated indices the last one wins,
        as if the items were updated one by one in order."""
        index = np.asarray(index, dtype=np.int64)
        if index.size == 0:
            return
        priority = np.broadcast_to(np.asarray(priority, dtype=np.float64), index.shape)
        # Keep the last occurrence of each index: unique() on the reversed array finds first occurrences.
        last, pos = np.unique(index[::-1], return_index=True)
        priority = priority[::-1][pos]
        nodes = last + self.size  # sorted, so each level's parents are too: dedup by neighbours
        self.sums[nodes] = priority
        self.mins[nodes] = np.where(priority > 0, priority, np.inf)
        while nodes[0] > 1:  # one vectorized step per level, up to the root
            nodes = nodes >> 1
            if len(nodes) > 1:
                nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
            left, right = 2 * nodes, 2 * nodes + 1
            self.sums[nodes] = self.sums[left] + self.sums[right]
            self.mins[nodes] = np.minimum(self.mins[left], self.mins[right])

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each value u in `mass` (in [0, total)), the leaf i with prefix_sum(i) <= u < prefix_sum(i + 1):
        a uniform u gives leaf i with probability priority_i / total."""
        u = np.asarray(mass, dtype=np.float64)
        leaf = self._descend(u.copy(), clamp=False)
        # Rounding can carry u an ulp past a node's sum, down an empty subtree to a zero leaf: walk those again,
        # keeping u inside each node (rare, so the common walk skips the two extra operations per level).
        stray = np.flatnonzero(self.sums[leaf + self.size] == 0)
        if len(stray):
            leaf[stray] = self._descend(u[stray].copy(), clamp=True)
        return leaf

    def _descend(self, u: np.ndarray, clamp: bool) -> np.ndarray:
        node = np.ones(u.shape, dtype=np.int64)
        for _ in range(self.size.bit_length() - 1):  # root to leaves, all items one level at a time
            if clamp:
                np.minimum(u, np.nextafter(self.sums[node], 0), out=u)
            node *= 2
            left = self.sums[node]
            right = u >= left
            u -= left * right
            node += right
        return node - self.size
