"""Direct prompting: one model reads every tool and decodes the whole call. The baseline.

Two prompting styles:
  * ``bfcl``: BFCL's own system prompt for prompt-based models (built by bfcl-eval itself, see
    `hyfunc.formats.bfcl.bfcl_prompt_messages`); the model answers in python-call syntax ``[f(a=1), g(b="x")]``.
  * ``native``: the model's own chat template with the tools passed as OpenAI tool dicts; the
    answer is read from ``<tool_call>`` blocks or a fenced JSON object (Qwen-Coder writes those).
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

from hyfunc.errors import InputError
from hyfunc.formats.bfcl import bfcl_prompt_messages
from hyfunc.formats.calls import (
    Call,
    CallParseError,
    parse_calls,
    parse_python_calls,
    to_bfcl_output,
)
from hyfunc.formats.schema import Tool
from hyfunc.formats.validate import ArgumentError, argument_errors
from hyfunc.methods import PROMPT_STYLES, PromptStyle
from hyfunc.methods.base import Answer, calls_text
from hyfunc.models.base import BackendBase, PrefixCache


_CALL_START = re.compile(r"^[\w.]+\(")


def _unfence(text: str) -> str:
    """The answer without a surrounding ``` or ```python fence."""
    return text.strip().strip("`").strip().removeprefix("python").strip()


def _python_answer_done(text: str) -> bool:
    """True once the text is a whole `[...]` call list, or is clearly prose (no call can follow).

    BFCL reads prose as "no call" however long it is, so stopping it early changes no verdict
    unless a call appeared later in the prose, which BFCL's decoder would reject anyway. A JSON
    call (`{"name": ...}` or a `<tool_call>` block, what the model writes after a conversation
    whose earlier calls its chat template rendered so) is not prose: it runs to its end.
    """
    text = _unfence(text)
    if len(text) > 80 and not text.startswith(("[", "{", "<tool_call>")) and not _CALL_START.match(text):
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
            raise InputError(f"unknown prompt style {style!r}; choose one of {PROMPT_STYLES}")
        if style == "native" and "tools" not in (backend.tokenizer.chat_template or ""):
            raise InputError(f"model '{backend.name}' has no tool-calling chat template; use style='bfcl'")
        self.backend = backend
        self.style = style
        self.max_new_tokens = max_new_tokens
        self.prefix_cache = PrefixCache(backend) if prefix_caching else None
        self.name = f"direct-{style}:{backend.name}"

    def prompt(self, messages: Sequence[dict], tools: Sequence[Tool]) -> str:
        if self.style == "bfcl":
            return self.backend.chat_prompt(bfcl_prompt_messages(messages, tools))
        return self.backend.chat_prompt(messages, tools=[tool.to_openai() for tool in tools])

    @property
    def config(self) -> dict:
        """What defines this method's answers, for run records."""
        return {"model": self.backend.name, "style": self.style, "max_new_tokens": self.max_new_tokens,
                "prefix_caching": self.prefix_cache is not None, "validate": True}

    def answer(
        self, messages: Sequence[dict], tools: Sequence[Tool], on_text: Callable[[str], None] | None = None
    ) -> Answer:
        """Prompt, decode greedily, parse the calls and check them against the tools' schemas.

        Output that cannot be parsed, and parsed calls that do not fit the offered tools (an
        unknown tool, a missing required argument, a value of the wrong type or outside its enum),
        both leave `calls` empty and set `error`; the model's calls are then kept in
        `details["invalid_calls"]`. All calls are dropped, not only the invalid ones: a caller
        would execute what is left as if it were the whole answer. A BFCL run scores this answer
        like an unparseable one (wrong on call categories; no call, so right, on irrelevance), as
        it would any method that checks its calls before returning them. `on_text` (optional)
        receives `calls_text(answer.calls)` once the answer is checked: the model writes python calls
        or free text, which cannot be streamed as JSON calls piecewise.
        """
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
            answer.calls = self.checked_calls(gen.text, tools)
        except CallParseError as err:
            answer.error = str(err)
        except ArgumentError as err:
            answer.error = f"calls that do not fit the tools' schemas: {err}"
            answer.details["invalid_calls"] = err.calls
        if on_text is not None:
            on_text(calls_text(answer.calls))
        return answer

    def checked_calls(self, text: str, tools: Sequence[Tool]) -> list[Call]:
        """The calls in the model's `text`; raises CallParseError when it cannot be read, and
        ArgumentError (with every problem, and the calls as JSON in `.calls`) when a call does
        not fit the offered tools."""
        calls = self.parse(text)
        problems = [problem for call in calls for problem in argument_errors(call, tools)]
        if problems:
            error = ArgumentError(problems)
            error.calls = to_bfcl_output(calls)
            raise error
        return calls

    def parse(self, text: str) -> list[Call]:
        if self.style == "bfcl":
            stripped = _unfence(text)
            if stripped.startswith("["):
                return parse_python_calls(stripped)
        return parse_calls(text)
