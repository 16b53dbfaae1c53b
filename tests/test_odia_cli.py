"""`hyfunc odia feedback|stats`: results, and one-line errors with non-zero exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyfunc.cli import main
from hyfunc.routing.store import encode
from hyfunc.routing.stores import open_store
from tests.pg_server import free_port
from tests.traffic_writer import request

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def logged(store_url: str) -> str:
    with open_store(store_url) as store:
        reqs = [request("r", i) for i in range(5)]
        reqs[3].path = "small"
        store.write([encode(r) for r in reqs])
    return store_url


def test_feedback_then_stats(logged: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["odia", "feedback", "r-1", "bad", "--store", logged]) == 0
    assert main(["odia", "feedback", "r-2", "good", "--store", logged]) == 0
    capsys.readouterr()
    assert main(["odia", "stats", "--store", logged, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["total"] == 5 and stats["by_path"] == {"cascade": 4, "small": 1}
    assert stats["feedback"] == {"bad": 1, "good": 1, "none": 3}
    assert [lib["requests"] for lib in stats["by_library"]] == [5]
    assert main(["odia", "stats", "--store", logged]) == 0
    text = capsys.readouterr().out
    assert "requests   5 (0 with an error)" in text and "feedback   good 1, bad 1, none 3" in text


def test_unknown_id_is_one_line_and_exit_2(logged: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["odia", "feedback", "nope", "good", "--store", logged]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: no logged request has id 'nope'")


def test_store_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["odia", "stats", "--store", str(tmp_path / "missing.sqlite")]) == 2
    assert "no traffic store at" in capsys.readouterr().err
    assert not (tmp_path / "missing.sqlite").exists()  # reading never creates a store
    assert main(["odia", "stats", "--store", "mysql://h/db"]) == 2
    assert "unsupported store URL" in capsys.readouterr().err
    assert main(["odia", "stats", "--store", f"postgresql://u:pw@127.0.0.1:{free_port()}/db"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unreachable" in err and "pw@" not in err


def test_entry_point_exit_code(tmp_path: Path) -> None:
    # Through the real command line: argparse, then the handler's exit code reaches the shell.
    env = dict(os.environ, PYTHONPATH=str(ROOT), HYFUNC_HOME=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "hyfunc.cli", "odia", "stats"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().endswith("(nothing logged yet, or a wrong --store)")
    assert str(tmp_path / "traffic.sqlite") in run.stderr
