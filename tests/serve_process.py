"""A real server process for the tests: uvicorn on a free loopback port, around tests/serve_app.py."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(settings: dict[str, Any] | None = None, command: list[str] | None = None,
                   startup: float = 120.0) -> Iterator[str]:
    """Yields the base URL (``http://127.0.0.1:PORT``) once /health says ready. `command`: a whole
    server command line instead of the test factory (its ``{port}`` is filled in)."""
    with server_process(settings, command, startup) as (url, _):
        yield url


@contextlib.contextmanager
def server_process(settings: dict[str, Any] | None = None, command: list[str] | None = None,
                   startup: float = 120.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """`running_server`, also yielding the process (to kill it)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HYFUNC_TEST_SERVE": json.dumps(settings or {})}
    if command is None:
        command = [sys.executable, "-m", "uvicorn", "--factory", "tests.serve_app:create", "--host", "127.0.0.1",
                   "--port", "{port}", "--log-level", "warning"]
    proc = subprocess.Popen([part.replace("{port}", str(port)) for part in command], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server was not ready after {startup:.0f} s")
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()  # SIGTERM: uvicorn's graceful shutdown
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
