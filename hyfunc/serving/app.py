"""The FastAPI app: OpenAI's Chat Completions on top of `ChatService` and the model worker.

Request path of ``POST /v1/chat/completions``: API key (401) -> body size (413, also enforced
while the body streams in) -> UTF-8 and JSON (400) -> strict pydantic validation (400, never
FastAPI's 422) -> `ChatService.prepare` (model 404, tool schemas, tool_choice, context: 400) ->
router -> the bounded queue (429 with Retry-After at once when full) -> `ChatService.answer` on
the model thread -> the same `Outcome` rendered as JSON or as server-sent events.

A streamed response sends the calls and a text reply as they are written; its stage timings,
which a header cannot carry (the headers leave first), follow the last chunk as an SSE comment
line (``: server-timing large_prefill;dur=12.3, ...``), which SSE clients, the openai SDK's
included, skip.

The body is parsed by hand rather than by a FastAPI body parameter so that every failure gets
OpenAI's error envelope and status; the OpenAPI schema still describes it (`openapi_extra`).

Probes: ``/health/live`` is 200 while the process answers HTTP at all (restart it when not);
``/health/ready`` is 503 while the models load or after they failed, and also, as "degraded", while
the oldest queued request has waited longer than `ServeConfig.ready_max_wait` (a load balancer
then sends new requests elsewhere until the queue drains); ``/health`` is readiness without the
degraded state, as it always was.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Mapping, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from hyfunc.models.interrupt import Interrupted
from hyfunc.routing.record import TrafficSink
from hyfunc.serving.errors import APIError, bad_request, from_validation
from hyfunc.serving.metrics import ServerMetrics
from hyfunc.serving.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    ErrorResponse,
    Health,
    Liveness,
    ModelList,
    Readiness,
)
from hyfunc.serving.service import (
    ChatService,
    Outcome,
    Prepared,
    Router,
    ServeConfig,
    path_name,
)
from hyfunc.serving.streaming import (
    DONE,
    ChunkWriter,
    completion_body,
    sse,
    sse_comment,
)
from hyfunc.serving.traffic_routes import add_traffic_routes, traffic_health
from hyfunc.serving.worker import Cancelled, ModelWorker, QueueFull

log = logging.getLogger("hyfunc.serving")

Methods = Union[Any, Mapping[str, Any]]
#: What `create_app` serves: a method, named methods (paths for a router), or a loader of either.
Serves = Union[Methods, Callable[[], Methods]]


class BodyTooLarge(Exception):
    pass


def _as_paths(methods: Methods) -> dict[str, Any]:
    if isinstance(methods, Mapping):
        return dict(methods)
    return {path_name(methods): methods}


class _State:
    """Readiness: `service` is set once the models are loaded; /health says 503 until then."""

    def __init__(self, config: ServeConfig, metrics: ServerMetrics, traffic: TrafficSink | None, router: Router | None):
        self.config, self.metrics, self.traffic, self.router = config, metrics, traffic, router
        self.service: ChatService | None = None
        self.status, self.detail = "loading", None
        self.worker = ModelWorker(config.max_queue, metrics, config.batch)

    def load(self, load_methods: Callable[[], Methods]) -> None:
        # The loader runs inside the try: a model that fails to load must show as "failed", not leave
        # the server "loading" for ever.
        try:
            self.service = ChatService(
                _as_paths(load_methods()), self.config, self.metrics, self.traffic, self.router, self.worker
            )
            self.status = "ok"
        except Exception as err:  # noqa: BLE001 - reported by /health and by 503s
            log.exception("loading the models failed")
            self.status, self.detail = "failed", f"{type(err).__name__}: {err}"

    def health(self) -> tuple[str, str | None]:
        if self.service is not None and self.service.failure is not None:
            return "failed", f"a model failed: {self.service.failure}"
        return self.status, self.detail

    def readiness(self) -> tuple[str, str | None]:
        """`health`, with "ready" for "ok", and "degraded" while the queue waits too long."""
        status, detail = self.health()
        if status != "ok":
            return status, detail
        waited, limit = self.worker.oldest_wait(), self.config.ready_max_wait
        if waited > limit:
            return "degraded", f"the oldest queued request has waited {waited:.1f} s, longer than {limit:g} s"
        return "ready", None

    def ready(self) -> ChatService:
        if self.service is not None and self.service.failure is not None:
            raise APIError(503, f"the models failed ({self.service.failure}); restart the server", code="model_failed")
        if self.service is None:
            message = "the models are still loading" if self.status == "loading" else f"the models failed to load: {self.detail}"
            raise APIError(503, message, code="model_not_ready", headers={"Retry-After": "5"})
        return self.service


class _Guard:
    """ASGI middleware: body-size limit (declared and actual bytes) and responses counted by status."""

    def __init__(self, app: Any, state: _State):
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.state.config.max_body_bytes
        counted = scope["path"].startswith("/v1/")

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start" and counted:
                self.state.metrics.requests.labels(status=str(message["status"])).inc()
            await send(message)

        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _too_large(limit).response()(scope, receive, counting_send)
            return
        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge
            return message

        await self.app(scope, limited_receive, counting_send)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than this server's limit of {limit} bytes", code="request_too_large")


def _authorize(request: Request, key: str | None) -> None:
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    # compare_digest: the time taken does not reveal how much of the key matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key")


def _parse(body: bytes) -> ChatCompletionRequest:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise bad_request(f"the request body is not valid UTF-8 (byte {err.start})", code="invalid_encoding") from None
    if not text.strip():
        raise bad_request("the request body is empty; expected a JSON object", code="invalid_json")

    def no_constants(name: str) -> None:
        raise ValueError(f"{name} is not valid JSON")

    try:
        data = json.loads(text, parse_constant=no_constants)
    except (json.JSONDecodeError, ValueError) as err:
        raise bad_request(f"the request body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as err:
        raise from_validation(err) from None


def _server_timing(outcome: Outcome) -> str:
    # Server-Timing is the standard header for stage timings (milliseconds); browsers show it.
    return ", ".join(f"{stage};dur={seconds * 1000:.1f}" for stage, seconds in outcome.timings.items())


def _timing_headers(outcome: Outcome) -> dict[str, str]:
    timing = _server_timing(outcome)
    return {"server-timing": timing} if timing else {}


def _failed(err: BaseException) -> APIError:
    """What the client hears when answering failed: the service's own refusal, or a 500."""
    if isinstance(err, APIError):
        return err
    return APIError(500, f"the model failed: {type(err).__name__}", code="model_error")


def _chat_openapi() -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}}}}


def create_app(
    serves: Serves,
    config: ServeConfig | None = None,
    traffic: TrafficSink | None = None,
    router: Router | None = None,
) -> FastAPI:
    """The server app. `serves`: a loaded method (a `Method`, e.g. from `hyfunc.load_method`),
    a mapping path -> method for a `router` to choose from, or a zero-argument loader of either,
    which runs in the background at startup (/health answers 503 until it is done). `traffic`
    receives one `ServedRequest` per answered request."""
    config = config or ServeConfig()
    metrics = ServerMetrics()
    state = _State(config, metrics, traffic, router)
    loader = serves if callable(serves) and not hasattr(serves, "answer") and not isinstance(serves, Mapping) else None
    if loader is None:
        state.load(lambda: serves)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if loader is not None:
            threading.Thread(target=state.load, args=(loader,), name="hyfunc-load", daemon=True).start()
        yield
        # Graceful shutdown: uvicorn has finished the open requests; let the worker drain.
        await asyncio.to_thread(state.worker.shutdown)

    app = FastAPI(title="hyfunc", version="0.1.0", lifespan=lifespan, description="OpenAI-compatible function calling")
    app.state.hyfunc = state
    app.add_middleware(_Guard, state=state)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(BodyTooLarge)
    async def _body_too_large(_: Request, __: BodyTooLarge) -> JSONResponse:
        return _too_large(config.max_body_bytes).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if err.status_code in (404, 405) else str(err.detail)
        return APIError(err.status_code, message, code="not_found" if err.status_code == 404 else None).response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, err: RequestValidationError) -> JSONResponse:
        return bad_request(str(err.errors()[0].get("msg", "invalid request"))).response()

    errors = {status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 503, 504)}

    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses=errors, openapi_extra=_chat_openapi())
    async def chat_completions(request: Request) -> Response:
        arrived = time.perf_counter()
        _authorize(request, config.api_key)
        service = state.ready()
        prepared = service.prepare(_parse(await request.body()))
        path = service.route(prepared)
        headers = {"x-hyfunc-path": path, "x-request-id": prepared.request_id}
        if prepared.request.stream:
            return _stream(service, prepared, path, headers, arrived, request)
        job = _submit(lambda job: service.answer(prepared, path, should_stop=job.should_stop), service.batch_group(prepared, path))
        try:
            outcome = await state.worker.wait(job, request.is_disconnected)
        except TimeoutError:
            raise APIError(504, f"the request took longer than the time limit of {config.request_timeout:g} s", code="timeout") from None
        except Cancelled:
            return Response(status_code=499)  # the client is gone; nobody reads this
        except Exception as err:  # noqa: BLE001 - in OpenAI's envelope, never a bare 500
            if not isinstance(err, APIError):
                log.exception("request %s failed", prepared.request_id)
            raise _failed(err) from None
        # The path that answered: a small-first route is decided on the worker (a stream's header
        # is sent before that, and names the route taken at arrival).
        metrics.e2e.labels(path=outcome.path).observe(time.perf_counter() - arrived)
        headers["x-hyfunc-path"] = outcome.path
        return JSONResponse(completion_body(outcome), headers={**headers, **_timing_headers(outcome)})

    def _submit(fn: Callable, group: Any = None) -> Any:
        try:
            return state.worker.submit(fn, config.request_timeout, group)
        except QueueFull:
            wait = state.worker.retry_after()
            raise APIError(
                429, f"the server is busy: {config.max_queue} requests are already waiting; retry in {wait} s",
                code="queue_full", headers={"Retry-After": str(wait)},
            ) from None

    def _stream(service: ChatService, prepared: Prepared, path: str, headers: dict, arrived: float, request: Request) -> Response:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def post(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, (kind, value))
            except RuntimeError:  # the event loop has closed (shutdown): nobody reads this any more
                pass

        def work(job: Any) -> None:
            try:
                outcome = service.answer(
                    prepared, path, lambda delta: post("text", delta), job.should_stop, lambda delta: post("call", delta)
                )
                post("done", outcome)
            except Interrupted:
                raise  # given up (client gone, time limit): nobody reads the events; the worker counts it
            except Exception as err:  # noqa: BLE001 - sent to the client as an error event
                if not isinstance(err, APIError):
                    log.exception("streamed request %s failed", prepared.request_id)
                post("error", err)

        job = _submit(work, service.batch_group(prepared, path))  # before the response starts: a full queue is still a plain 429
        writer = ChunkWriter(prepared.request_id, prepared.created, prepared.request.model)
        include_usage = bool(prepared.request.stream_options and prepared.request.stream_options.include_usage)

        async def body() -> AsyncIterator[bytes]:
            finished = False
            first = True

            def first_token() -> None:
                nonlocal first
                if first:
                    metrics.ttft.observe(time.perf_counter() - arrived)
                    first = False

            try:
                yield sse(writer.role())
                while True:
                    try:
                        kind, value = await asyncio.wait_for(events.get(), max(0.0, job.deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        job.cancel()
                        yield sse(APIError(504, "the request took longer than the time limit", code="timeout").body())
                        yield DONE
                        return
                    if kind == "text":
                        first_token()
                        yield sse(writer.text(value))
                    elif kind == "call":
                        first_token()
                        yield sse(writer.tool_call(value))
                    elif kind == "error":
                        yield sse(_failed(value).body())
                        yield DONE
                        return
                    else:
                        break
                outcome: Outcome = value
                yield sse(writer.finish(outcome))
                if include_usage:
                    yield sse(writer.usage(outcome))
                timing = _server_timing(outcome)
                if timing:
                    yield sse_comment(f"server-timing {timing}")
                yield DONE
                finished = True
                metrics.e2e.labels(path=path).observe(time.perf_counter() - arrived)
            finally:
                if not finished:
                    job.cancel()  # client gone or failed: free the slot (or stop the text reply)

        return StreamingResponse(body(), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"})

    @app.get("/v1/models", response_model=ModelList, responses=errors)
    async def models(request: Request) -> dict:
        _authorize(request, config.api_key)
        service = state.ready()
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "hyfunc"} for m in service.model_ids()]}

    # Kept as it was, not an alias of /health/ready: deployments probe it for liveness too, and a
    # busy server that answered 503 here would be restarted and lose its queue.
    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health() -> JSONResponse:
        status, detail = state.health()
        body = {"status": status, "detail": detail}
        if (log := traffic_health(traffic)) is not None:
            body["traffic"] = log  # the traffic log's counters: written, dropped, lost, ...
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/health/live", response_model=Liveness)
    async def live() -> dict:
        return {"status": "live"}

    @app.get("/health/ready", response_model=Readiness, responses={503: {"model": Readiness}})
    async def ready() -> JSONResponse:
        status, detail = state.readiness()
        return JSONResponse({"status": status, "detail": detail}, status_code=200 if status == "ready" else 503)

    # POST /v1/feedback and the traffic log's metrics (traffic_routes.py), when a log is given.
    add_traffic_routes(app, traffic, metrics.registry, lambda request: _authorize(request, config.api_key))

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    base_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = base_openapi()
            request_schema = ChatCompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(request_schema.pop("$defs", {}))
            components["ChatCompletionRequest"] = request_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
