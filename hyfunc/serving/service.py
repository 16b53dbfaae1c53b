"""The one place where a chat request is answered and its outcome recorded.

`ChatService.prepare` checks a parsed request against what the models can take (400s, in the
event loop, before the request is queued); `ChatService.route` picks the answering path (the
router's slot) and refuses a tool library that path cannot read (400) or that no cache holds and
takes more than `ServeConfig.max_new_tool_tokens` (413), and answers 429 while a new library too
large for one prompt is embedded off the request path (library_jobs.py); `ChatService.answer` runs on the model
worker: it applies `tool_choice` and `parallel_tool_calls`, asks the method, falls back to a
forced call or a text reply, builds the `ServedRequest` and hands it to the traffic sink.
Streaming and non-streaming responses are both rendered from the `Outcome` it returns, so they
cannot disagree; a streamed request also gets the calls as they are written (`on_call`, from a
`CallStream` that builds the Outcome's calls too) and a text reply as it is written (`on_text`).

A failure of the models themselves (a RuntimeError or MemoryError from an engine, e.g. an
out-of-memory or a failed llama.cpp decode) may leave a KV state half-written: the service then
refuses every later request (503, and /health says so) instead of answering from a broken state.
A bad request is refused before it reaches the models and does not count.
"""
from __future__ import annotations

import copy
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from hyfunc.cascade.library import DISK_CACHE_BYTES
from hyfunc.formats.calls import Call, CallParseError, parse_calls
from hyfunc.formats.schema import SchemaError, Tool, parse_tool
from hyfunc.methods.base import Answer, answer_streaming, calls_text
from hyfunc.models.base import PrefixCache
from hyfunc.routing.record import ServedRequest, TrafficSink
from hyfunc.serving.call_stream import CallStream
from hyfunc.serving.conversation import Conversation, read_conversation
from hyfunc.serving.errors import APIError, bad_request
from hyfunc.serving.library_cache import LibraryCache, fingerprint
from hyfunc.serving.library_jobs import LibraryJobs
from hyfunc.serving.metrics import ServerMetrics
from hyfunc.serving.protocol import ChatCompletionRequest
from hyfunc.serving.replies import FALLBACK_TEXT, CallWriter, reply_messages, write_text
from hyfunc.serving.worker import ModelWorker

log = logging.getLogger("hyfunc.serving")

REPLY_MARGIN = 32  # tokens of chat-template framing not counted in the transcript
#: Libraries up to this many tools are read in one prompt (`HyFuncMethod.MAX_PROMPT_TOOLS`, direct
#: prompting); larger ones only by a cascade that reads them per function.
JOINT_TOOLS = 128
#: Context kept for the retrieved tools when a library is read per function (the small model's
#: prompt holds only those): counting the tokens of thousands of tools per request is not worth it.
RETRIEVED_TOOLS_TOKENS = 2048
#: Tools offered to a forced call (tool_choice required) from a library read per function: the
#: method's best ranked ones, since every offered tool goes into that prompt.
FORCED_FROM_LIBRARY = 16
#: Exceptions after which the models are not trusted any more (see the module's docstring).
FATAL = (RuntimeError, MemoryError)


@dataclass
class ServeConfig:
    served_model: str = "hyfunc"  # the model id clients send and /v1/models lists
    api_key: str | None = None
    max_queue: int = 16  # requests waiting for the model worker beyond the one running; then 429
    max_body_bytes: int = 4 * 1024 * 1024
    request_timeout: float = 300.0  # seconds from arrival; then 504
    default_max_tokens: int = 256  # text replies, when the request sets no max_tokens
    max_tokens_cap: int = 2048
    max_tools: int = 10_000  # more than JOINT_TOOLS: served per function by a cascade with a library retriever
    context_tokens: int | None = None  # default: the large model's max_position_embeddings
    library_cache: int = 8  # tool libraries whose state the cascade keeps (0: off)
    library_cache_bytes: int = 2 * 1024**3
    library_disk_cache_bytes: int = DISK_CACHE_BYTES  # per-function library embeddings on disk, LRU
    # Tokens of a tool library no cache holds, per request; then 413 (0: no cap). Generous: a library
    # of 128 tools read in one prompt fits; a 4,000-tool one is served once its embeddings are on disk.
    max_new_tool_tokens: int = 32_768
    ready_max_wait: float = 30.0  # seconds the oldest queued request may wait; then /health/ready is degraded
    # New libraries embedded at once off the request path (library_jobs.py); 0: on the request path.
    library_jobs: int = 2
    library_job_grace: float = 60.0  # seconds past its Retry-After that a job waits for its client
    # Requests run together, their model steps batched (worker.py, models/step_batcher.py): cascade
    # requests on llama.cpp over the same library already held. 1: one request at a time.
    batch: int = 1


@dataclass
class Prepared:
    """A checked request, ready for the worker."""

    request: ChatCompletionRequest
    conversation: Conversation
    tools: list[Tool]
    choice: str  # auto | none | required | named
    named: str | None
    parallel: bool
    max_tokens: int
    request_id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Outcome:
    request_id: str
    created: int
    model: str
    path: str
    tool_calls: list[dict]  # OpenAI form, with their call_… ids
    text: str | None
    finish_reason: str  # tool_calls | stop | length
    prompt_tokens: int
    completion_tokens: int
    timings: dict[str, float]
    trimmed_messages: int = 0  # the oldest turns left out to fit the context


#: Picks the answering path for a request: a key of the app's methods (e.g. "small", "cascade").
Router = Callable[[Prepared], str]


def path_name(method: Any) -> str:
    if hasattr(method, "large") and hasattr(method, "small"):
        return "cascade"
    if hasattr(method, "backend"):
        return "direct"
    return str(getattr(method, "name", "method"))


def text_backend(method: Any) -> Any:
    """The model that writes text replies: the large one."""
    return method.large if hasattr(method, "large") else method.backend


def call_backend(method: Any) -> Any:
    """The model that writes forced calls: the small one when there is one (it writes calls)."""
    return method.small if hasattr(method, "small") else method.backend


def model_names(method: Any) -> dict[str, str]:
    if hasattr(method, "large"):
        return {"method": method.name, "large": method.large.name, "small": method.small.name}
    return {"method": method.name, "model": text_backend(method).name}


class ChatService:
    def __init__(
        self,
        methods: Mapping[str, Any],
        config: ServeConfig,
        metrics: ServerMetrics,
        traffic: TrafficSink | None = None,
        router: Router | None = None,
        worker: ModelWorker | None = None,
    ):
        """`worker`: the model worker, which runs new libraries' embedding jobs between requests
        (without one, or with `config.library_jobs` 0, they are embedded on the request path)."""
        if not methods:
            raise ValueError("no method to serve")
        self.methods = dict(methods)
        self.config, self.metrics, self.traffic, self.router = config, metrics, traffic, router
        self.library = LibraryCache(config.library_cache, config.library_cache_bytes, metrics, config.library_disk_cache_bytes)
        self.calls = CallWriter()
        self.failure: str | None = None  # set by a fatal model error: the service answers no more
        self.jobs = None if worker is None or config.library_jobs <= 0 else LibraryJobs(
            worker.submit_background, worker.mean_service_seconds, config.library_jobs, config.library_job_grace,
            metrics, self._job_failed,
        )
        self._text_caches: dict[tuple[int, int], PrefixCache] = {}  # (model, thread): batched requests run side by side
        self._library_lock = threading.Lock()  # a library state is chosen (or built) by one request at a time
        self._batchable = {path for path, method in self.methods.items() if config.batch > 1
                           and getattr(method, "enable_batching", lambda on_run: False)(
                               lambda model, n: metrics.engine_steps.labels(model=model, sequences=str(n)).inc())}
        if config.batch > 1 and not self._batchable:
            log.warning("--batch %d has no effect: only a cascade with both models on llama.cpp batches requests", config.batch)
        first = next(iter(self.methods.values()))
        backend = text_backend(first)
        # A copy for counting tokens in the event loop while the worker uses the original: a fast
        # tokenizer raises "Already borrowed" when one instance is used by two threads at once.
        self._tokenizer = copy.deepcopy(backend.tokenizer)
        self.context_tokens = config.context_tokens or backend.context_length

    def batch_group(self, prepared: Prepared, path: str) -> tuple[str, str] | None:
        """Which requests this one may run beside (see worker.py): those of the same batchable
        cascade over the same tool library, already held (so none of them builds it), under `auto`;
        None: it runs alone."""
        if path not in self._batchable or not prepared.tools or prepared.choice != "auto":
            return None
        if not self.library.holds(self.methods[path], prepared.tools):
            return None
        return path, fingerprint(prepared.tools)

    def model_ids(self) -> list[str]:
        return [self.config.served_model] + [m.name for m in self.methods.values() if m.name != self.config.served_model]

    def count(self, text: str) -> int:
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def _tool_tokens(self, tools: Sequence[Tool]) -> Iterator[int]:
        """Each tool's tokens: its JSON schema, as the models read it."""
        return (self.count(json.dumps(t.to_json_schema(), ensure_ascii=False)) for t in tools)

    # -- before the queue ------------------------------------------------------------------
    def prepare(self, request: ChatCompletionRequest) -> Prepared:
        if request.model not in self.model_ids():
            raise APIError(
                404, f"The model {request.model!r} does not exist; this server serves {', '.join(self.model_ids())}",
                param="model", code="model_not_found",
            )
        tools = self._tools(request)
        choice, named = "auto", None
        if request.tool_choice is not None:
            if not tools:
                raise bad_request("tool_choice is only allowed when tools are given", param="tool_choice")
            if isinstance(request.tool_choice, str):
                choice = request.tool_choice
            else:
                choice, named = "named", request.tool_choice.function.name
                if named not in {t.name for t in tools}:
                    raise bad_request(
                        f"tool_choice names the function {named!r}, which is not among the tools given",
                        param="tool_choice.function.name",
                    )
        wanted = request.max_completion_tokens or request.max_tokens or self.config.default_max_tokens
        max_tokens = min(wanted, self.config.max_tokens_cap)
        if len(tools) > JOINT_TOOLS and not named:  # read per function (see `route`)
            tool_tokens = RETRIEVED_TOOLS_TOKENS
        else:
            read = [t for t in tools if t.name == named] if named else tools
            tool_tokens = sum(self._tool_tokens(read))
        budget = self.context_tokens - tool_tokens - max_tokens - REPLY_MARGIN
        if budget <= 0:
            raise APIError(
                400, f"the tools take {tool_tokens} tokens: with max_tokens {max_tokens} they leave no room for the "
                f"conversation in the model's context of {self.context_tokens} tokens",
                param="tools", code="context_length_exceeded",
            )
        conversation = read_conversation(request.messages).bounded(budget, self.count)
        parallel = request.parallel_tool_calls is not False
        return Prepared(request, conversation, tools, choice, named, parallel, max_tokens)

    def _tools(self, request: ChatCompletionRequest) -> list[Tool]:
        raw = request.tools or []
        if len(raw) > self.config.max_tools:
            raise bad_request(
                f"{len(raw)} tools given; this server takes at most {self.config.max_tools}", param="tools",
                code="too_many_tools",
            )
        tools: list[Tool] = []
        seen: dict[str, int] = {}
        for i, tool in enumerate(raw):
            try:
                parsed = parse_tool(tool.model_dump(exclude_none=True))
            except SchemaError as err:
                raise bad_request(f"tools[{i}]: {err}", param=f"tools[{i}].function", code="invalid_tool_schema") from None
            if parsed.name in seen:
                raise bad_request(
                    f"tools[{i}]: duplicate function name {parsed.name!r} (also tools[{seen[parsed.name]}])",
                    param=f"tools[{i}].function.name", code="duplicate_tool_name",
                )
            seen[parsed.name] = i
            tools.append(parsed)
        return tools

    def route(self, prepared: Prepared) -> str:
        """The router's slot: without one, the first method answers everything."""
        if self.router is None:
            path = next(iter(self.methods))
        else:
            path = self.router(prepared)
            if path not in self.methods:
                raise RuntimeError(f"the router chose {path!r}; paths: {', '.join(self.methods)}")
        self._check_library(prepared, path)
        # A library being embedded passed the cap when its job started: its polls skip the count.
        large = len(prepared.tools) > JOINT_TOOLS
        if self.jobs is None or not large or not self.jobs.embedding(self.methods[path], prepared.tools):
            self._check_new_tools(prepared, path)
        self._check_embedded(prepared, path)
        return path

    def _check_library(self, prepared: Prepared, path: str) -> None:
        """A library over JOINT_TOOLS tools fits no prompt: only a cascade that reads it per
        function (its artifact has a library retriever) can take it."""
        n = len(prepared.tools)
        if n <= JOINT_TOOLS or prepared.choice == "none" or prepared.named:
            return
        mode = getattr(self.methods[path], "library_mode", None)
        if mode is None or mode(n) != "per_function":
            raise bad_request(
                f"{n} tools given: the {path!r} path reads every tool in one prompt, at most {JOINT_TOOLS}; larger "
                "libraries are read per function by a cascade prepared with `hyfunc prepare --library`",
                param="tools", code="too_many_tools",
            )

    def _check_new_tools(self, prepared: Prepared, path: str) -> None:
        """A tool library no cache holds costs the models time in proportion to its tokens (a
        prefix pass, or one pass per tool): past `max_new_tool_tokens` it is refused unqueued."""
        cap, tools = self.config.max_new_tool_tokens, prepared.tools
        # Nothing read anew under tool_choice none; a named choice reads one tool, bounded by the context.
        if not cap or not tools or prepared.choice == "none" or prepared.named:
            return
        if self.library.holds(self.methods[path], tools):
            return
        total = 0
        for counted, tokens in enumerate(self._tool_tokens(tools), 1):
            total += tokens
            if total > cap:  # stop counting: the rest cannot bring it back under the cap
                break
        else:
            return
        took = f"its {len(tools)} tools take" if counted == len(tools) else f"the first {counted} of its {len(tools)} tools take"
        raise APIError(
            413, f"the request's tool library is new to this server and {took} {total} tokens, more than its cap of "
            f"{cap} new tool tokens per request: send fewer tools, or start the server with a higher --max-new-tool-tokens",
            param="tools", code="too_many_tool_tokens",
        )

    def _check_embedded(self, prepared: Prepared, path: str) -> None:
        """A library read per function whose embeddings are neither held nor on disk is embedded
        off the request path: 429 with Retry-After until it is."""
        if self.jobs is None or len(prepared.tools) <= JOINT_TOOLS or prepared.choice == "none" or prepared.named:
            return
        method = self.methods[path]
        if not self.library.holds(method, prepared.tools):
            self.jobs.admit(method, prepared.tools, self.config.library_disk_cache_bytes)

    def _job_failed(self, err: BaseException) -> None:
        if isinstance(err, FATAL):  # the KV state may be half-written, as in `answer`
            self.failure = f"{type(err).__name__}: {err}"

    # -- on the model worker ---------------------------------------------------------------
    def answer(
        self, prepared: Prepared, path: str, on_text: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False, on_call: Callable[[dict], None] | None = None,
    ) -> Outcome:
        """`on_text`: the text reply's deltas; `on_call`: tool-call deltas (OpenAI's
        ``delta.tool_calls`` elements), both as they are written."""
        if self.failure is not None:  # queued before a fatal error
            raise APIError(503, f"the models failed earlier ({self.failure}); restart the server", code="model_failed")
        try:
            return self._answer(prepared, path, on_text, should_stop, on_call)
        except FATAL as err:
            self.failure = f"{type(err).__name__}: {err}"
            log.exception("fatal model error on %s; refusing further requests", prepared.request_id)
            raise

    def _answer(
        self, prepared: Prepared, path: str, on_text: Callable[[str], None] | None,
        should_stop: Callable[[], bool], on_call: Callable[[dict], None] | None,
    ) -> Outcome:
        method = self.methods[path]
        conv, tools = prepared.conversation, prepared.tools
        timings: dict[str, float] = {}
        prompt_tokens = completion_tokens = 0
        notes: list[str] = []
        tool_calls: list[dict] = []
        calls: list[Call] = []
        max_calls = None if prepared.parallel else 1
        if tools and prepared.choice != "none":
            offered = [t for t in tools if t.name == prepared.named] if prepared.named else tools
            if not prepared.named:  # a named choice is a one-tool library: not worth caching
                with self._library_lock:
                    reused, seconds = self.library.select(method, offered)
                if seconds:
                    timings["library_build"] = seconds
            # Under auto, calls already made and answered are not made again (an agent would loop).
            skip = conv.answered_calls() if prepared.choice == "auto" else ()
            stream = CallStream(offered, on_call, max_calls, skip)
            result = answer_streaming(method, conv.method_messages(), offered, stream.feed)
            stream.close()
            if hasattr(method, "answered_by"):  # a path that decides while answering (small first)
                path, method = method.answered_by(result)
            timings.update(result.timings)
            prompt_tokens += result.input_tokens
            completion_tokens += result.output_tokens + result.injected_tokens
            self.metrics.cached_tokens.inc(result.cached_tokens)
            self.metrics.injected_tokens.inc(result.injected_tokens)
            self.metrics.generation_tokens.inc(result.output_tokens)
            notes += stream.notes
            if result.error:
                notes.append(f"unparsed model output: {result.error}")
            if not stream.calls and prepared.choice != "auto":
                # required / named: the method declined; the decoder must write a call.
                forced_tools = self._forced_tools(offered, result)
                stream = CallStream(forced_tools, on_call, max_calls)
                forced = self.calls.write(
                    call_backend(method), conv.transcript(), forced_tools, single=not prepared.parallel, on_text=stream.feed
                )
                stream.close()
                notes += stream.notes
                timings["forced_prefill"], timings["forced_decode"] = forced.prefill_seconds, forced.decode_seconds
                prompt_tokens += forced.input_tokens
                completion_tokens += forced.generated_tokens + forced.injected_tokens
                self.metrics.generation_tokens.inc(forced.generated_tokens)
                self.metrics.injected_tokens.inc(forced.injected_tokens)
            tool_calls, calls = stream.tool_calls(), stream.parsed()
        text, finish = None, "tool_calls"
        if calls and prepared.named:
            finish = "stop"  # what OpenAI returns for a named tool_choice
        if not calls:
            backend = text_backend(method)
            messages = reply_messages(conv, tools, prepared.choice)
            reply = write_text(backend, messages, prepared.max_tokens, on_text, should_stop, self._text_cache(backend),
                               hold_calls=bool(tools))
            text, finish = reply.text, "length" if reply.truncated else "stop"
            if reply.call_text:
                tool_calls, calls, text, finish = self._calls_in_reply(prepared, reply.call_text, on_call, on_text, notes)
            timings["text_reply"] = reply.seconds
            prompt_tokens += reply.input_tokens
            completion_tokens += reply.output_tokens
            self.metrics.cached_tokens.inc(reply.cached_tokens)
            self.metrics.generation_tokens.inc(reply.output_tokens)
        self.metrics.prompt_tokens.inc(prompt_tokens)
        self.metrics.observe_stages(timings)
        outcome = Outcome(
            prepared.request_id, prepared.created, prepared.request.model, path, tool_calls, text,
            finish, prompt_tokens, completion_tokens, timings, conv.dropped,
        )
        self._record(prepared, outcome, calls, method, "; ".join(notes) or None)
        return outcome

    def _calls_in_reply(
        self, prepared: Prepared, call_text: str, on_call: Callable[[dict], None] | None,
        on_text: Callable[[str], None] | None, notes: list[str],
    ) -> tuple[list[dict], list[Call], str | None, str]:
        """The large model, asked for a text reply next to tools, wrote a call: under `auto` it is
        made if it fits the offered tools and is not a repeat of an answered call (the
        `CallStream` checks); else the fallback text. Call text never reaches the client as text."""
        calls: list[Call] = []
        if prepared.choice == "auto":
            try:
                calls = parse_calls(call_text)
            except CallParseError:
                calls = []
        if calls:
            stream = CallStream(prepared.tools, on_call, None if prepared.parallel else 1,
                                prepared.conversation.answered_calls())
            stream.feed(calls_text(calls))
            stream.close()
            notes += stream.notes
            if stream.calls:
                notes.append("the text reply was a call")
                return stream.tool_calls(), stream.parsed(), None, "tool_calls"
        notes.append(f"the text reply was a call, not made: {call_text[:200]}")
        if on_text is not None:
            on_text(FALLBACK_TEXT)
        return [], [], FALLBACK_TEXT, "stop"

    def _text_cache(self, backend: Any) -> PrefixCache:
        """One prefix cache per model (and worker thread) for text replies: what a reply's prompt
        shares with the previous reply's (the system prompt and hint; in an agent loop, the whole
        earlier conversation) is not run again."""
        key = (id(backend), threading.get_ident())
        if key not in self._text_caches:
            self._text_caches[key] = PrefixCache(backend)
        return self._text_caches[key]

    @staticmethod
    def _forced_tools(offered: list[Tool], result: Answer) -> list[Tool]:
        """The tools a forced call may name: all offered ones, or for a library read per function
        (too large for the prompt) the method's best ranked ones."""
        if len(offered) <= JOINT_TOOLS:
            return offered
        by_name = {t.name: t for t in offered}
        ranked = [by_name[n] for n in result.details.get("ranking", []) if n in by_name]
        return (ranked or offered)[:FORCED_FROM_LIBRARY]

    def _record(self, prepared: Prepared, outcome: Outcome, calls: list[Call], method: Any, error: str | None) -> None:
        """Hand the outcome to the traffic log; a failing sink never fails the request."""
        if self.traffic is None:
            return
        try:
            record = ServedRequest(
                messages=[m.model_dump(exclude_none=True) for m in prepared.request.messages],
                tools=[t.to_openai() for t in prepared.tools],
                calls=[{"name": c.name, "arguments": c.arguments} for c in calls],
                text=outcome.text or "",
                path=outcome.path,
                models=model_names(method),
                timings=dict(outcome.timings),
                input_tokens=outcome.prompt_tokens,
                output_tokens=outcome.completion_tokens,
                error=error,
                request_id=outcome.request_id,
                created=float(outcome.created),
            )
            self.traffic.record(record)
        except Exception:  # noqa: BLE001 - the log is best effort by design
            self.metrics.traffic_errors.inc()
            log.exception("traffic sink failed on %s", outcome.request_id)
