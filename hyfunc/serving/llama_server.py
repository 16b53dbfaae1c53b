"""llama.cpp's own OpenAI server (`llama-server`) as a baseline process: the direct-prompting anchor
`hyfunc bench serve --llama-server` compares against, on the same GGUF the llama.cpp engine runs.

`make llama-server` builds the binary from the llama-cpp-python source the project compiles
(`scripts/build_llama_server.sh`). It runs with `--jinja` (the model's chat template renders the
tools and its tool-call parser reads the reply) and `-np` parallel slots, which llama-server decodes
in one batch: its own batching across requests.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from hyfunc.errors import SetupError


class LlamaServerError(SetupError):
    """llama-server is missing, or did not become healthy; the message says which and why."""


def find_binary(name: str) -> Path:
    """`name` as a path, else beside this Python (the venv's bin/, where `make llama-server` puts it), else on PATH."""
    for candidate in (Path(name), Path(sys.executable).parent / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise LlamaServerError(f"no llama-server binary '{name}': build it with `make llama-server` (from the "
                           "llama-cpp-python source the project compiles) or pass its path")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: SIGTERM when the benchmark dies, even killed (no `finally` then), on Linux."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextmanager
def llama_server(binary: Path, gguf: Path, *, slots: int, context_per_slot: int, threads: int, log: Path,
                 start_timeout: float = 300.0) -> Iterator[str]:
    """A running `llama-server` on loopback (its base URL), stopped on exit. Each of the `slots`
    parallel sequences gets `context_per_slot` tokens (llama-server splits `-c` among its slots)."""
    port = _free_port()
    command = [str(binary), "-m", str(gguf), "--jinja", "--host", "127.0.0.1", "--port", str(port),
               "-np", str(slots), "-c", str(slots * context_per_slot), "-t", str(threads), "--no-webui"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                raise LlamaServerError(f"llama-server exited with {process.returncode} while loading; see {log}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise LlamaServerError(f"llama-server was not healthy after {start_timeout:g} s; see {log}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
