"""The programs of `rlark up --demo`: a small but real embodied RL loop.

- ``rlark_demo.learner`` (cluster ``cloud``): holds the policy, samples candidate
  policies, serves them over HTTP, updates the policy from the returns the rollouts post
  (the cross-entropy method) and reports the mean return of every iteration.
- ``rlark_demo.rollout`` (cluster ``edge``, one simulated arm and one camera per replica):
  fetches a candidate, drives the arm through the embodied Python SDK, reads a camera frame,
  computes the episode's return from the arm's joint state and posts it back.
- ``rlark_demo.cem``: the learning rule and the task (goal, return), numpy only.

See docs/embodied.md, "The embodied RL demo".
"""
