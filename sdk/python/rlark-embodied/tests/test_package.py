"""The installed distribution (`pip install ./sdk/python/rlark-embodied`) ships what the source tree has:
every module, the gencode and its .pyi stubs, and py.typed. The other tests import the
source tree (pytest's pythonpath), so this is what ties them to the installed package."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from conftest import SDK

SRC = SDK / "src"


def test_installed_package_matches_source() -> None:
    # Not the egg-info a local build leaves in src/ (on sys.path through pytest's pythonpath).
    path = [p for p in sys.path if Path(p or ".").resolve() != SRC.resolve()]
    dist = next(iter(metadata.distributions(name="rlark-embodied", path=path)), None)
    if dist is None:
        pytest.fail("rlark-embodied is not installed: pip install './sdk/python/rlark-embodied[test]'")
    assert dist.version == "0.1.0"
    requires = dist.requires or []
    assert any(r.startswith("grpcio") and "extra" not in r for r in requires), requires
    assert any(r.startswith("protobuf") and "extra" not in r for r in requires), requires

    installed = {
        str(f): f
        for f in dist.files or []
        if str(f).startswith("rlark_embodied/") and "__pycache__" not in str(f)
    }
    source = {
        str(p.relative_to(SRC)): p
        for p in (SRC / "rlark_embodied").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert "rlark_embodied/py.typed" in installed
    assert "rlark_embodied/_gen/robot_pb2.pyi" in installed
    assert sorted(installed) == sorted(source), "reinstall: pip install './sdk/python/rlark-embodied[test]'"
    stale = [
        name
        for name, path in source.items()
        if installed[name].locate().read_bytes() != path.read_bytes()
    ]
    assert not stale, f"installed copy is stale in {stale}: pip install './sdk/python/rlark-embodied[test]'"
