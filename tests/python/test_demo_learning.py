"""The `rlark up --demo` learner's rule and bookkeeping (examples/demo/rlark_demo), without
rlark: the cross-entropy update, the return, and how candidates are handed out and
collected. The whole loop runs end to end in crates/rlark/tests/e2e/up_demo.rs."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "demo"))
sys.path.insert(0, os.path.join(ROOT, "sdk", "python", "rlark", "src"))

from rlark_demo import cem  # noqa: E402
from rlark_demo.learner import Learner  # noqa: E402


def test_the_return_is_minus_the_distance_to_the_goal():
    assert cem.episode_return(cem.GOAL) == 0.0
    off = cem.GOAL.copy()
    off[0] += 0.3
    assert cem.episode_return(off) == pytest.approx(-0.3)
    with pytest.raises(ValueError, match="expected 6 joint positions"):
        cem.episode_return([0.0, 0.0])


def test_the_update_refits_to_the_elite():
    method = cem.CrossEntropy(population=4, elite=2, min_std=0.0)
    candidates = np.array([[0.0] * 6, [1.0] * 6, [2.0] * 6, [3.0] * 6])
    method.update(candidates, np.array([-3.0, -0.5, -0.1, -2.0]))
    assert method.mean == pytest.approx(np.full(6, 1.5))
    assert method.std == pytest.approx(np.full(6, 0.5))
    with pytest.raises(ValueError, match="one return per candidate"):
        method.update(candidates, np.array([0.0]))
    with pytest.raises(ValueError, match="elite < population"):
        cem.CrossEntropy(population=3, elite=3)


def test_the_method_finds_the_goal_from_returns_alone():
    method = cem.CrossEntropy(seed=1)
    first = None
    for _ in range(8):
        candidates = method.sample()
        returns = np.array([cem.episode_return(c) for c in candidates])
        first = returns.mean() if first is None else first
        method.update(candidates, returns)
    assert cem.episode_return(method.mean) - first > 0.3


def test_the_learner_hands_out_each_candidate_once_and_ignores_stale_results(monkeypatch):
    reports = []
    monkeypatch.setattr("rlark.report", lambda **fields: reports.append(fields))
    learner = Learner(iterations=2, population=3, elite=1, seed=0)
    work = [learner.work("a"), learner.work("b"), learner.work("a")]
    assert [w["candidate"] for w in work] == [0, 1, 2]
    assert learner.work("b") == {"wait": 0.05}
    learner.result({"iteration": 2, "candidate": 0, "return": -1.0})  # not this iteration
    for w, r in zip(work, [-1.0, -0.5, -2.0]):
        learner.result({"iteration": 1, "candidate": w["candidate"], "return": r})
        learner.result({"iteration": 1, "candidate": w["candidate"], "return": 9.0})  # repeat
    assert reports == [{"step": 1, "reward": round(-3.5 / 3, 4), "best": -0.5}]
    assert learner.iteration == 2
    for i in range(3):
        learner.result({"iteration": 2, "candidate": learner.work("a")["candidate"], "return": -0.1})
    assert learner.done and not learner.finished.is_set()
    assert learner.work("a") == {"done": True}
    assert not learner.finished.is_set()  # b has not heard it yet
    assert learner.work("b") == {"done": True}
    assert learner.finished.is_set()
