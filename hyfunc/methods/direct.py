"""Direct prompting: one model reads every tool and decodes the whole call. The baseline.

Two prompting styles:
  * ``bfcl``: BFCL's own system prompt for prompt-based models (built by bfcl-eval itself, see
    `hyfunc.formats.bfcl.bfcl_prompt_messages`); the model answers in python-call syntax ``[f(a=1), g(b="x")]``.
  * ``native``: the model's own chat template with the tools passed as OpenAI tool dicts; the
    answer is read from ``<tool_call>`` blocks or a fenced JSON object (Qwen-Coder writes those).
"""
from __future__ import annotations

import re
from typing import Callable, Literal, Sequence

from hyfunc.formats.bfcl import bfcl_prompt_messages
from hyfunc.formats.calls import CallParseError, parse_calls, parse_python_calls
from hyfunc.formats.schema import Tool
from hyfunc.methods.base import Answer, calls_text
from hyfunc.models.base import BackendBase, PrefixCache

PromptStyle = Literal["bfcl", "native"]
PROMPT_STYLES: tuple[str, ...] = ("bfcl", "native")


_CALL_START = re.compile(r"^[\w.]+\(")


def _unfence(text: str) -> str:
    """The answer without a surrounding ``` or ```python fence."""
    return text.strip().strip("`").strip().removeprefix("python").strip()


def _python_answer_done(text: str) -> bool:
    """True once the text is a whole `[...]` call list, or is clearly prose (no call can follow).

    BFCL reads prose as "no call" however long it is, so stopping it early changes no verdict
    unless a call appeared later in the prose, which BFCL's decoder would reject anyway.
    """
    text = _unfence(text)
    if len(text) > 80 and not text.startswith("[") and not _CALL_START.match(text):
        return True
    if not (text.startswith("[") and text.endswith("]")):
        return False
    try:
        parse_python_calls(text)
    except CallParseError:
        return False
    return True


class DirectMethod:
    def __init__(
        self, backend: BackendBase, style: PromptStyle = "bfcl", max_new_tokens: int = 384, prefix_caching: bool = False
    ):
        """`prefix_caching` reuses the KV cache of the prompt prefix shared with the previous request
        (exact; with a fixed tool library, the library is read once)."""
        if style not in PROMPT_STYLES:
            raise ValueError(f"unknown prompt style {style!r}; choose one of {PROMPT_STYLES}")
        if style == "native" and "tools" not in (backend.tokenizer.chat_template or ""):
            raise ValueError(f"model '{backend.name}' has no tool-calling chat template; use style='bfcl'")
        self.backend = backend
        self.style = style
        self.max_new_tokens = max_new_tokens
        self.prefix_cache = PrefixCache(backend) if prefix_caching else None
        self.name = f"direct-{style}:{backend.name}"

    def prompt(self, messages: Sequence[dict], tools: Sequence[Tool]) -> str:
        if self.style == "bfcl":
            return self.backend.chat_prompt(bfcl_prompt_messages(messages, tools))
        return self.backend.chat_prompt(messages, tools=[tool.to_openai() for tool in tools])

    def answer(
        self, messages: Sequence[dict], tools: Sequence[Tool], on_text: Callable[[str], None] | None = None
    ) -> Answer:
        """`on_text` (optional) receives `calls_text(answer.calls)` once the answer is parsed: the
        model writes python calls or free text, which cannot be streamed as JSON calls piecewise."""
        ids = self.backend.encode(self.prompt(messages, tools))
        stop = _python_answer_done if self.style == "bfcl" else None
        gen = self.backend.generate(ids=ids, max_new_tokens=self.max_new_tokens, stop=stop, prefix_cache=self.prefix_cache)
        answer = Answer(
            calls=[],
            raw_text=gen.text,
            input_tokens=gen.input_tokens,
            output_tokens=len(gen.token_ids),
            cached_tokens=gen.cached_tokens,
            timings={"prefill": gen.prefill_seconds, "decode": gen.decode_seconds},
        )
        try:
            answer.calls = self.parse(gen.text)
        except CallParseError as err:
            answer.error = str(err)
        if on_text is not None:
            on_text(calls_text(answer.calls))
        return answer

    def parse(self, text: str) -> list:
        if self.style == "bfcl":
            stripped = _unfence(text)
            if stripped.startswith("["):
                return parse_python_calls(stripped)
        return parse_calls(text)
