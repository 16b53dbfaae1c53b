"""What a `pip install` of the package carries: the bundled data, and the declared dependencies."""
from __future__ import annotations

import json
import subprocess
import tomllib
from fnmatch import fnmatch
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hyfunc.data import DATA_DIR, FC_TRAIN, TOOL_LIBRARY

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _tracked(directory: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", str(directory)], cwd=ROOT, capture_output=True, check=True).stdout
    return [str((ROOT / p).relative_to(directory)) for p in out.decode().split("\0") if p]


def test_every_tracked_data_file_is_package_data():
    """setuptools installs only what the package-data globs match: a file they miss is absent from a
    wheel, and a fresh install would fail to find it (the test suite, run from the tree, would not)."""
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["hyfunc.data"]
    files = [f for f in _tracked(DATA_DIR) if not f.endswith(".py")]
    assert files
    missed = [f for f in files if not any(fnmatch(f, g) for g in globs)]
    assert not missed, f"not in a wheel: {missed}"


def test_the_bundled_training_data_is_whole():
    counts = {p.name: sum(1 for line in p.read_text().splitlines() if line.strip()) for p in FC_TRAIN.glob("*.jsonl")}
    assert sum(counts.values()) == 3121 and len(counts) == 7  # the numbers of fc-train/README.md
    tools = [json.loads(line) for line in TOOL_LIBRARY.read_text().splitlines() if line.strip()]
    assert len(tools) == 4076 and all(t["name"] and "parameters" in t for t in tools)
    assert (FC_TRAIN / "LICENSES.md").is_file() and (FC_TRAIN / "README.md").is_file()


def test_dependencies_are_ranges_and_the_constraints_pin_them():
    """A library declares ranges (pins would fight its users' environments); `make` installs the exact
    versions of requirements/constraints.txt, which must cover every declared dependency."""
    declared = PYPROJECT["project"]["dependencies"] + [
        req for extra in PYPROJECT["project"]["optional-dependencies"].values() for req in extra
        if not req.startswith("hyfunc[")
    ]
    assert not [req for req in declared if "==" in req]
    pinned = {canonicalize_name(line.split("==")[0]) for line in
              (ROOT / "requirements" / "constraints.txt").read_text().splitlines() if "==" in line}
    names = {canonicalize_name(Requirement(req).name) for req in declared}
    assert names <= pinned, f"no exact version in requirements/constraints.txt: {sorted(names - pinned)}"
