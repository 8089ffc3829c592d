"""The demo's rollout: episodes of a simulated arm, driven through the embodied SDK.

Run as ``python3 -m rlark_demo.rollout`` in an rlark task that requests one
``rlinf.io/robot-sim-arm`` and one ``rlinf.io/camera-sim``: the agent gives the replica
its devices in ``RLINF_EMBODIED_DEVICES`` (``robot-arm-1,camera-cam-1``) and the sockets
in ``RLINF_EMBODIED_ROS_SOCKET_PATH`` and ``RLINF_EMBODIED_CAMERA_SOCKET_PATH``, which
``RobotClient()`` and ``CameraClient()`` read (docs/embodied.md).

The learner is ``$DEMO_LEARNER_URL`` when set, else
``http://$RLARK_HEAD_ADDRESS:$DEMO_LEARNER_PORT``: the learner is the Job's head task, and
its name resolves over the Job's Domain network.

One episode: ResetRobot (the arm at rest, joints at 0), StartRobot in mode ``teleop`` with
the candidate as ``target`` at ``SPEED`` rad/s, wait until the arm stops moving (at most
``HORIZON`` s), read its joint positions (GetRobotStatus), capture a camera frame, post
the return. The arm is stopped when the learner says ``done``, and by the runtime's safety
watchdog if this process dies.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import rlark
from rlark_embodied import CameraClient, RobotClient

from .cem import HORIZON, SPEED, episode_return

# How long the learner may stay unreachable (it may start after the rollouts).
CONNECT_PATIENCE = 60.0


def learner_url() -> str:
    url = os.environ.get("DEMO_LEARNER_URL")
    if url:
        return url.rstrip("/")
    head = os.environ.get("RLARK_HEAD_ADDRESS")
    if not head:
        sys.exit("rollout: neither DEMO_LEARNER_URL nor RLARK_HEAD_ADDRESS is set")
    return f"http://{head}:{os.environ.get('DEMO_LEARNER_PORT', '8000')}"


def devices() -> tuple[str, str]:
    """The arm and the camera this replica holds."""
    held = [d for d in os.environ.get("RLINF_EMBODIED_DEVICES", "").split(",") if d]
    arms = [d.removeprefix("robot-") for d in held if d.startswith("robot-")]
    cameras = [d.removeprefix("camera-") for d in held if d.startswith("camera-")]
    if len(arms) != 1 or len(cameras) != 1:
        sys.exit(
            f"rollout: expected one robot and one camera in RLINF_EMBODIED_DEVICES, got {held}"
        )
    return arms[0], cameras[0]


def call(url: str, body: dict | None = None) -> dict:
    """GET (or POST ``body``) as JSON, retrying while the learner is not reachable yet."""
    deadline = time.monotonic() + CONNECT_PATIENCE
    data = None if body is None else json.dumps(body).encode()
    while True:
        request = urllib.request.Request(url, data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            if time.monotonic() >= deadline:
                sys.exit(f"rollout: the learner at {url} did not answer: {e}")
            time.sleep(0.2)


def run_episode(robots: RobotClient, arm: str, target: list[float]) -> np.ndarray:
    """The arm from rest towards ``target``; its joint positions when it stopped moving."""
    robots.reset_robot(arm)
    robots.start_robot(
        arm,
        "teleop",
        args={"target": ",".join(f"{t:.6f}" for t in target), "speed": str(SPEED)},
    )
    deadline = time.monotonic() + HORIZON
    while True:
        status = robots.get_robot_status(arm)
        if not status.sim.moving or time.monotonic() >= deadline:
            return np.array(status.sim.positions)
        time.sleep(0.02)


def main() -> None:
    me = rlark.task()
    replica = f"{me.replica_index}" if me else "0"
    arm, camera = devices()
    url = learner_url()
    print(f"rollout {replica}: arm {arm}, camera {camera}, learner {url}", flush=True)
    episodes = 0
    with RobotClient() as robots, CameraClient() as cameras:
        cameras.open_camera(camera)
        try:
            while True:
                work = call(f"{url}/work?replica={replica}")
                if work.get("done"):
                    break
                if "wait" in work:
                    time.sleep(float(work["wait"]))
                    continue
                positions = run_episode(robots, arm, work["target"])
                frame = cameras.capture_frame(camera)
                ret = episode_return(positions)
                episodes += 1
                call(
                    f"{url}/result",
                    {
                        "iteration": work["iteration"],
                        "candidate": work["candidate"],
                        "return": ret,
                        "replica": replica,
                    },
                )
                rlark.report(
                    step=episodes,
                    reward=round(ret, 4),
                    iteration=work["iteration"],
                    frame=frame.sequence,
                )
        finally:
            robots.stop_robot(arm)
            cameras.close_camera(camera)
    print(f"rollout {replica}: {episodes} episodes, arm {arm} stopped", flush=True)
    rlark.flush(10)


if __name__ == "__main__":
    main()
