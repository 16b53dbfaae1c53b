"""Schemathesis against the server's own OpenAPI schema: no input may get a 5xx. Bounded (a few
dozen generated requests per operation) so that it runs in CI; the models are tiny random ones.

Cases come from the operations' hypothesis strategies (schemathesis' pytest plugin does not run
under this pytest), and are sent to a real server process."""
from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from hyfunc.serving import ServeConfig, create_app
from tests.serve_process import running_server

# The schema does not depend on the models: an app whose loader never runs describes it.
SCHEMA = schemathesis.openapi.from_dict(create_app(lambda: None, ServeConfig()).openapi())
OPERATIONS = {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in SCHEMA.get_all_operations())}


@pytest.fixture(scope="module")
def server() -> Any:
    with running_server({"method": "cascade", "max_body_bytes": 65536, "max_tokens_cap": 16}) as url:
        yield url


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_no_input_gets_a_server_error(server: str, name: str) -> None:
    statuses: list[int] = []

    @given(case=OPERATIONS[name].as_strategy())
    @settings(max_examples=60 if "chat" in name else 5, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    def send(case: Any) -> None:
        if isinstance(case.body, dict) and "model" in case.body and len(statuses) % 4:
            case.body["model"] = "hyfunc"  # most cases get past the model check, deeper into the request path
        response = case.call(base_url=server, timeout=60)
        statuses.append(response.status_code)
        assert response.status_code < 500, (case.body, response.text)

    send()
    assert statuses
