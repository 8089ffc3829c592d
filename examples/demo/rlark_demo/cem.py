"""The demo's learning rule and task, numpy only (no I/O, so it is testable alone).

The task: bring a 6-joint simulated arm from rest (all joints at 0) to the joint
configuration ``GOAL`` within one episode. The policy is the commanded joint target, a
6-vector; the arm's controller (``rlark embodied``'s sim backend) moves each joint towards
it at a limited speed. The return of an episode is minus the distance, in radians, between
where the arm ended up and ``GOAL``: 0 is perfect.

The learner does not know ``GOAL``: it only sees returns. It improves the policy with the
cross-entropy method: each iteration it samples ``population`` candidate targets from a
Gaussian (mean, std), the rollouts run one episode per candidate, and the mean and std are
refitted to the ``elite`` candidates with the best returns.
"""

from __future__ import annotations

import numpy as np

JOINTS = 6

# Where the arm should go (radians). Only the rollouts' return function uses it.
GOAL = np.array([0.45, -0.3, 0.35, -0.15, 0.25, -0.4])

# The commanded speed of every joint (rad/s) and the longest episode (s): the arm reaches
# any target within +-SPEED * HORIZON = +-2 rad before the episode ends, with room to
# spare on a loaded machine (an episode ends as soon as the arm stops moving).
SPEED = 2.0
HORIZON = 1.0


def episode_return(positions: np.ndarray) -> float:
    """Minus the distance between the arm's final joint positions and GOAL."""
    positions = np.asarray(positions, dtype=float)
    if positions.shape != GOAL.shape:
        raise ValueError(f"expected {JOINTS} joint positions, got {positions.shape}")
    return -float(np.linalg.norm(positions - GOAL))


class CrossEntropy:
    """A diagonal-Gaussian cross-entropy method over the joint target."""

    def __init__(
        self,
        population: int = 10,
        elite: int = 3,
        init_std: float = 0.3,
        min_std: float = 0.02,
        seed: int = 0,
    ) -> None:
        if not 1 <= elite < population:
            raise ValueError(f"need 1 <= elite < population, got {elite} and {population}")
        self.population = population
        self.elite = elite
        self.min_std = min_std
        self.mean = np.zeros(JOINTS)
        self.std = np.full(JOINTS, init_std)
        self._rng = np.random.default_rng(seed)

    def sample(self) -> np.ndarray:
        """``population`` candidate targets, one per row."""
        return self.mean + self.std * self._rng.standard_normal((self.population, JOINTS))

    def update(self, candidates: np.ndarray, returns: np.ndarray) -> None:
        """Refit mean and std to the ``elite`` candidates with the highest returns."""
        candidates = np.asarray(candidates, dtype=float)
        returns = np.asarray(returns, dtype=float)
        if candidates.shape != (self.population, JOINTS) or returns.shape != (self.population,):
            raise ValueError("one return per candidate expected")
        best = candidates[np.argsort(returns)[-self.elite :]]
        self.mean = best.mean(axis=0)
        self.std = best.std(axis=0) + self.min_std
