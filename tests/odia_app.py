"""The server as `hyfunc serve --traffic URL [--router DIR]` builds it, around tiny random models.

Run by uvicorn in a subprocess (tests/serve_process.py): ``python -m uvicorn --factory
tests.odia_app:create``. HYFUNC_TEST_SERVE (JSON): ``traffic`` (the flag's value: "" = the
embedded SQLite store), ``router`` (a routing directory, see hyfunc.routing.routed), any other key
a `ServeConfig` field. The traffic log and the routing come from the same functions the CLI calls.
"""
from __future__ import annotations

import json
import os
from typing import Any

from fastapi import FastAPI

from hyfunc.routing.recording import traffic_log
from hyfunc.routing.routed import routed_serving
from hyfunc.serving import ServeConfig, create_app
from tests.serve_app import tiny_cascade


def create() -> FastAPI:
    settings: dict[str, Any] = json.loads(os.environ.get("HYFUNC_TEST_SERVE", "{}"))
    traffic = traffic_log(settings.pop("traffic", None))
    routing, poll = settings.pop("router", None), settings.pop("poll", 5.0)
    settings.setdefault("context_tokens", 4096)
    settings.setdefault("default_max_tokens", 12)
    if routing is None:
        return create_app(tiny_cascade(), ServeConfig(**settings), traffic=traffic)
    load, router = routed_serving(tiny_cascade, routing, poll_seconds=poll)
    return create_app(load, ServeConfig(**settings), traffic=traffic, router=router)
