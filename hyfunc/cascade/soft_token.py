"""The large model's side of the cascade: one forward pass -> a soft token and function embeddings.

Prompt layout (rendered with the model's own chat template)::

    <system>  INSTRUCTION + TOOLS_HEADER + one JSON schema per line, tools separated by "\\n"
    <user>    the request (or the caller's conversation)
    <assistant generation prompt>

- soft token: last-layer hidden state at the last prompt position, i.e. the state from which the
  first answer token would be decoded (HyFunc's "first soft token"); nothing is decoded.
- function embedding: mean of last-layer hidden states over the tokens of that tool's JSON line.

The token ids are built segment by segment (text before the tool block, each tool line, the
separators, text after the block) and concatenated. Tokenizing the joint string and mapping
character offsets back would be fragile: BPE merges across segment borders (Qwen has a single
token for '"}\\n'), so a tool's span would not be a clean set of tokens. Concatenated segment
ids are still a valid tokenization of the same text, and they make the prompt split exactly
into a request-independent prefix (template + instruction + tools) and a suffix (the request),
which is what lets a `LibraryCache` hold the prefix's KV cache and reproduce the full pass.

Causal attention gives two exact identities the tests rely on: the tools' hidden states depend
only on the tokens before them, so (1) a cached prefix holds the function embeddings of the full
pass, and (2) embedding a tool in its own prompt (instruction + that tool) equals its embedding as
the first tool of a list. Tools further down a list see the earlier tools: embeddings from
`embed_functions` (per-function mode) and from `encode` (joint mode) differ for them, so train the
retriever on the mode used at inference.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

import jinja2
import torch

from hyfunc.formats.schema import Tool, parse_tools
from hyfunc.models.backend import Backend
from hyfunc.models.base import StepOutput

INSTRUCTION = (
    "You are an expert in composing function calls. You are given a request and a set of possible "
    "functions. Based on the request, make one or more function calls to achieve the purpose. "
    "If none of the functions can be used, point it out and make no call. If the request lacks "
    "parameters required by a function, also point it out."
)
TOOLS_HEADER = "\n\nHere is a list of functions in JSON format that you can invoke, one per line:\n"
TOOL_SEPARATOR = "\n"

# Stands in for the tool block while the chat template renders; split out again afterwards.
_TOOLS_MARK = "<<hyfunc-tool-block-7f3a9c>>"

Messages = Sequence[Mapping[str, str]]
Request = Union[str, Messages]
ToolsLike = Sequence[Union[Tool, Mapping]]


def tool_line(tool: Tool) -> str:
    """The one-line JSON text a tool is shown as (and mean-pooled over)."""
    return json.dumps(tool.to_json_schema())


@dataclass
class PromptLayout:
    ids: list[int]  # the whole prompt
    spans: list[tuple[int, int]]  # [start, end) token span of each tool's JSON line in `ids`
    prefix_len: int  # tokens up to the end of the tool block: what a LibraryCache holds
    before_text: str  # rendered text in front of the tool block (template + instruction)


@dataclass
class Encoding:
    soft_token: torch.Tensor  # (H,) float32
    function_embeddings: torch.Tensor  # (n_tools, H) float32
    input_tokens: int  # tokens run through the model by this call (the suffix only when cached)
    seconds: float
    cached_tokens: int = 0  # prompt tokens taken from a LibraryCache instead of being run
    # The pass's last step (next-token logits, KV cache) when the prompt held the tools (joint
    # mode): the large model can go on writing from it (large_values.py). Fork before extending.
    state: StepOutput | None = None


@dataclass
class LibraryCache:
    """KV cache of [template + instruction + a fixed tool list], built once, forked per request."""

    tools: list[Tool]
    before_text: str  # a request whose rendered prompt starts differently cannot use this cache
    prefix_ids: list[int]
    cache: Any  # the large model's KV state of the prefix (engine-specific)
    function_embeddings: torch.Tensor  # (n_tools, H), from the prefix pass
    seconds: float  # time to build

    def __len__(self) -> int:
        return len(self.prefix_ids)


def _as_messages(request: Request) -> list[dict]:
    if isinstance(request, str):
        return [{"role": "user", "content": request}]
    messages = [dict(m) for m in request]
    if not messages:
        raise ValueError("request: empty message list")
    return messages


def _to_output(t: torch.Tensor) -> torch.Tensor:
    # Backend.forward runs under inference_mode; cloning outside it gives an ordinary tensor
    # that can later feed autograd (retriever training) without "inference tensor" errors.
    return t.detach().to("cpu", torch.float32).clone()


class SoftTokenEncoder:
    def __init__(self, backend: Backend, instruction: str = INSTRUCTION, batch_size: int = 8):
        self.backend = backend
        self.instruction = instruction
        self.batch_size = batch_size  # tools per forward pass in per-function mode
        self._sep_ids = backend.encode(TOOL_SEPARATOR)
        self._no_tools: LibraryCache | None = None  # instruction-only prefix, built on first use

    # -- prompt ----------------------------------------------------------------------------
    def split_template(self, request: Request) -> tuple[str, str]:
        """Rendered prompt text before and after the tool block."""
        messages = _as_messages(request)
        # A caller's own system prompt goes after the tool block, so the prefix stays request-independent.
        extra = ""
        if messages[0].get("role") == "system":
            extra = "\n\n" + messages[0].get("content", "")
            messages = messages[1:]
        block = self.instruction + TOOLS_HEADER + _TOOLS_MARK + extra
        try:
            text = self.backend.chat_prompt([{"role": "system", "content": block}, *messages])
        except jinja2.TemplateError:
            # Templates without a system role (e.g. Gemma) raise: open the first user turn with the block.
            if not messages or messages[0].get("role") != "user":
                raise
            first = {**messages[0], "content": block + "\n\n" + messages[0].get("content", "")}
            text = self.backend.chat_prompt([first, *messages[1:]])
        if text.count(_TOOLS_MARK) != 1:
            raise ValueError("the chat template altered the prompt: cannot place the tool block")
        before, after = text.split(_TOOLS_MARK)
        return before, after

    def layout(self, request: Request, tools: ToolsLike) -> PromptLayout:
        before, after = self.split_template(request)
        ids, spans = self._prefix_ids(before, parse_tools(tools))
        prefix_len = len(ids)
        return PromptLayout(ids + self.backend.encode(after), spans, prefix_len, before)

    def _prefix_ids(self, before: str, tools: list[Tool]) -> tuple[list[int], list[tuple[int, int]]]:
        ids = self.backend.encode(before)
        spans = []
        for i, tool in enumerate(tools):
            if i:
                ids += self._sep_ids
            line = self.backend.encode(tool_line(tool))
            spans.append((len(ids), len(ids) + len(line)))
            ids += line
        return ids, spans

    @staticmethod
    def _pool(hidden: torch.Tensor, spans: list[tuple[int, int]], offset: int = 0) -> torch.Tensor:
        if not spans:
            return torch.empty(0, hidden.shape[-1])
        return torch.stack([_to_output(hidden[s - offset : e - offset].float().mean(0)) for s, e in spans])

    # -- joint mode: instruction + tools + request in one pass ------------------------------
    def encode(self, request: Request, tools: ToolsLike | LibraryCache) -> Encoding:
        """One forward pass. With a LibraryCache only the request's tokens are run."""
        start = time.perf_counter()
        if isinstance(tools, LibraryCache):
            return self._encode_cached(request, tools, start)
        layout = self.layout(request, tools)
        step = self.backend.forward(ids=layout.ids, output_hidden=True)
        return Encoding(
            soft_token=_to_output(step.hidden[-1]),
            function_embeddings=self._pool(step.hidden, layout.spans),
            input_tokens=len(layout.ids),
            seconds=time.perf_counter() - start,
            state=StepOutput(step.logits, None, step.cache),
        )

    def build_library(self, tools: ToolsLike) -> LibraryCache:
        """Run [template + instruction + tools] once; keep its KV cache and function embeddings."""
        start = time.perf_counter()
        tools = parse_tools(tools)
        before, _ = self.split_template("")
        ids, spans = self._prefix_ids(before, tools)
        step = self.backend.forward(ids=ids, output_hidden=True)
        return LibraryCache(
            tools=tools,
            before_text=before,
            prefix_ids=ids,
            cache=step.cache,
            function_embeddings=self._pool(step.hidden, spans),
            seconds=time.perf_counter() - start,
        )

    def _encode_cached(self, request: Request, library: LibraryCache, start: float) -> Encoding:
        before, after = self.split_template(request)
        if before != library.before_text:
            raise ValueError("this request renders a different prompt prefix than the library cache was built with")
        suffix = self.backend.encode(after)
        # Only the last position's state is read (the function embeddings are the library's).
        step = self.backend.forward(ids=suffix, cache=self.backend.fork(library.cache), output_hidden=True,
                                    hidden_to_keep=1)
        return Encoding(
            soft_token=_to_output(step.hidden[-1]),
            function_embeddings=library.function_embeddings,
            input_tokens=len(suffix),
            seconds=time.perf_counter() - start,
            cached_tokens=len(library.prefix_ids),
            state=StepOutput(step.logits, None, step.cache) if library.tools else None,
        )

    # -- per-function mode: libraries too large for one prompt ------------------------------
    def encode_request(self, request: Request) -> Encoding:
        """The soft token of [instruction + request], no tools (function_embeddings is empty);
        the instruction's KV cache is built on first use and reused."""
        if self._no_tools is None:
            self._no_tools = self.build_library([])
        return self.encode(request, self._no_tools)

    @torch.inference_mode()
    def encode_requests(self, requests: Sequence[str]) -> torch.Tensor:
        """(n, H): `encode_request(r).soft_token` of each request, in one batched pass after the
        instruction's cached KV (the sentences of a request, library.py), each soft token read at
        its own last token. One short pass reads the weights once, however many rows."""
        if not requests:
            return torch.empty(0, self.backend.hidden_size)
        if self._no_tools is None:
            self._no_tools = self.build_library([])
        library = self._no_tools
        suffixes = []
        for request in requests:
            before, after = self.split_template(request)
            if before != library.before_text:
                raise ValueError("this request renders a different prompt prefix than the instruction cache was built with")
            suffixes.append(self.backend.encode(after))
        hidden = self.backend.hidden_of_lines(library.cache, suffixes)
        return _to_output(torch.stack([h[-1] for h in hidden]))

    def embed_functions(self, tools: ToolsLike, batch_size: int | None = None) -> torch.Tensor:
        """(n, H): each tool embedded in its own prompt [template + instruction + that tool].

        The shared [template + instruction] prefix is run once; each batch repeats its KV cache
        and runs only the tools' tokens. Lines are right-padded: under causal attention a real
        token never sees the padding after it, so no attention mask is needed and results equal
        those of one tool at a time.
        """
        return _to_output(self._embed_functions(parse_tools(tools), batch_size or self.batch_size))

    @torch.inference_mode()
    def _embed_functions(self, tools: list[Tool], batch_size: int) -> torch.Tensor:
        before, _ = self.split_template("")
        prefix = self.backend.prefill(self.backend.encode(before))
        encoded = [self.backend.encode(tool_line(t)) for t in tools]
        # Batches of similar lengths: padding is compute thrown away (lengths vary ~10x in a library).
        order = sorted(range(len(tools)), key=lambda i: len(encoded[i]))
        out: dict[int, torch.Tensor] = {}
        for b in range(0, len(order), batch_size):
            batch = order[b : b + batch_size]
            lines = [encoded[i] for i in batch]
            hidden = self.backend.hidden_of_lines(prefix, lines)
            out.update((i, h.float().mean(0)) for i, h in zip(batch, hidden))
        return torch.stack([out[i] for i in range(len(tools))]) if out else torch.empty(0, self.backend.hidden_size)


class SharedLargePass:
    """Lets cascade variants (the ablations) that answer the same request with the same large model
    share its one forward pass: the first computes it, the others reuse the Encoding. Holds only the
    latest request, which is all a side-by-side evaluation needs."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._encoding: Encoding | None = None

    def encode(
        self, encoder: SoftTokenEncoder, messages: Sequence[dict], tools: Sequence[Tool], source
    ) -> tuple[Encoding, bool]:
        """(encoding of `messages` over `source` (the tools or their LibraryCache), reused?)."""
        key = json.dumps([list(messages), [t.to_json_schema() for t in tools]], sort_keys=True, default=repr)
        if key == self._key and self._encoding is not None:
            return self._encoding, True
        self._key, self._encoding = key, encoder.encode(messages, source)
        return self._encoding, False
