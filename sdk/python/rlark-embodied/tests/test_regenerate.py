"""The checked-in gencode is what scripts/regenerate.py makes from the repo's protos, and
pyproject.toml's runtime bounds match the versions that gencode demands."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from conftest import SDK

GEN = SDK / "src" / "rlark_embodied" / "_gen"
PYPROJECT = (SDK / "pyproject.toml").read_text()


def _files(root: Path) -> dict[str, str]:
    return {
        p.name: p.read_text()
        for p in sorted(root.iterdir())
        if p.is_file() and p.suffix in (".py", ".pyi")
    }


def test_checked_in_gencode_is_up_to_date(tmp_path: Path) -> None:
    pinned = re.search(r'"grpcio-tools==([^"]+)"', PYPROJECT)
    assert pinned, "pyproject.toml pins grpcio-tools in its test extra"
    try:
        installed = metadata.version("grpcio-tools")
    except metadata.PackageNotFoundError:
        pytest.fail("grpcio-tools is not installed: pip install './sdk/python/rlark-embodied[test]'")
    assert installed == pinned.group(1), (
        f"grpcio-tools {installed} installed, pyproject pins {pinned.group(1)}: "
        "pip install './sdk/python/rlark-embodied[test]'"
    )

    out = tmp_path / "_gen"
    result = subprocess.run(
        [sys.executable, str(SDK / "scripts" / "regenerate.py"), "--out", str(out)],
        check=False,  # the assertion below shows stderr
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    fresh, checked_in = _files(out), _files(GEN)
    assert sorted(fresh) == sorted(checked_in), "generated file set differs"
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert not stale, (
        f"checked-in gencode is stale in {stale}: run python sdk/python/rlark-embodied/scripts/regenerate.py"
    )


def test_runtime_bounds_match_gencode() -> None:
    robot_pb2 = (GEN / "robot_pb2.py").read_text()
    robot_grpc = (GEN / "robot_pb2_grpc.py").read_text()
    gencode = re.search(r"# Protobuf Python Version: (\S+)", robot_pb2)
    grpc_gen = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", robot_grpc)
    assert gencode and grpc_gen
    major = gencode.group(1).split(".")[0]
    assert f'"protobuf>={gencode.group(1)},<{int(major) + 1}"' in PYPROJECT, (
        f"pyproject.toml must require protobuf>={gencode.group(1)},<{int(major) + 1} "
        "(protobuf gencode needs a runtime at least as new, of the same major version)"
    )
    assert f'"grpcio>={grpc_gen.group(1)},<2"' in PYPROJECT, (
        f"pyproject.toml must require grpcio>={grpc_gen.group(1)}"
    )
