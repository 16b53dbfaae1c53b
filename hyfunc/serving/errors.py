"""Errors in OpenAI's envelope: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal of the server goes through `APIError`, so clients (the `openai` SDK raises
`BadRequestError`, `AuthenticationError`, ... from the status) always get the same shape, and a
pydantic validation error becomes a 400 that names the offending field, never FastAPI's 422.
"""
from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

# OpenAI's error types per status; `code` is finer (e.g. "model_not_found").
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        error_type = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _location(loc: tuple) -> str:
    """``("messages", 0, "user", "content")`` -> ``messages[0].content``: pydantic puts the
    discriminator's tag (the role) into the path, which is no field of the request."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i and isinstance(loc[i - 1], int) and part in ("system", "developer", "user", "assistant", "tool"):
            continue
        elif part in ("str", "list[TextPart]", "NamedToolChoice", "literal['auto','none','required']"):
            continue  # the branch of a union that was tried
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation(err: ValidationError) -> APIError:
    """The first problem, in words, with the field's path as `param` (what OpenAI reports)."""
    first = err.errors(include_url=False)[0]
    param = _location(tuple(first["loc"])) or None
    where = f"{param}: " if param else ""
    extra = f" ({len(err.errors())} problems)" if len(err.errors()) > 1 else ""
    return bad_request(f"{where}{first['msg']}{extra}", param=param, code="invalid_value")
