"""The templating decoder's public API: decode calls with the small model, build training targets."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from hyfunc.cascade.templating.session import GaveUp, Session, ValueWriter
from hyfunc.cascade.templating.vocab import Vocab, vocab_for
from hyfunc.cascade.templating.walker import Walker, dumps
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import Param, Tool
from hyfunc.models.backend import StepOutput


@dataclass
class TemplatedOutput:
    calls: list[Call]
    text: str  # the full JSON emitted
    token_ids: list[int]  # every emitted token, generated and injected, in order
    generated_tokens: int  # tokens chosen by the model's logits (argmax over an allowed set)
    injected_tokens: int  # tokens forced by the template
    forward_calls: int  # model forward passes run by the decoder
    seconds: float  # wall time of `decode`
    forward_seconds: float = 0.0  # of which in model forward passes
    drafted_tokens: int = 0  # value tokens proposed by copying from `draft_source`
    accepted_draft_tokens: int = 0  # of which the model's own greedy choice (no pass of their own)
    rewinds: int = 0  # repeated calls or array items taken back by the repeat guard
    min_probability: float = 1.0  # lowest probability of a generated token among the allowed ones
    gave_up: bool = False  # stopped when min_probability fell below `give_up_below`: no calls


class TemplateDecoder:
    """Dynamic templating decoder over a `Backend` (the small model).

    `decode(step, tools)`: `step` is the `StepOutput` of the prompt's last position (its cache is
    extended in place; pass a fork to keep it), `tools` the candidate tools (may be empty: the
    output is then ``[]``). Greedy; the output always parses, names only offered tools and
    arguments, and passes `argument_errors`.
    """

    def __init__(
        self,
        backend: Any,
        max_calls: int = 8,
        max_string_tokens: int = 64,
        max_array_items: int = 16,
        max_number_chars: int = 24,
        max_any_depth: int = 2,
        max_draft_tokens: int = 24,
        stop_on_repeat: bool = True,
    ):
        if max_calls < 1:
            raise ValueError("max_calls must be >= 1")
        self.backend = backend
        self.max_calls = max_calls
        self.max_string_tokens = max_string_tokens
        self.max_array_items = max(1, max_array_items)
        self.max_number_chars = max_number_chars
        self.max_any_depth = max_any_depth
        self.max_draft_tokens = max_draft_tokens
        self.stop_on_repeat = stop_on_repeat
        self._vocab: Vocab | None = None

    def vocab(self, size: int | None = None) -> Vocab:
        """Per-tokenizer tables (token texts, string/number/punctuation masks), built once."""
        size = size or len(self.backend.tokenizer)
        if self._vocab is None or self._vocab.size != size:
            self._vocab = vocab_for(self.backend.tokenizer, size)
        return self._vocab

    def decode(
        self, step: StepOutput, tools: Sequence[Tool], require_call: bool = False, draft_source: str = "",
        on_text: Callable[[str], None] | None = None, give_up_below: float = 0.0,
        write_value: ValueWriter | None = None, alternatives: bool = False,
    ) -> TemplatedOutput:
        """`require_call`: at least one call when `tools` is not empty (the caller has already
        decided that a tool fits, e.g. the retriever); otherwise ``[]`` is the model's choice.
        `draft_source`: text that string values are likely copied from (the request); drafts
        from it are verified by the model, so they change the speed, not the output.
        `on_text`: called with each piece of the output text (injected or generated) in order, as
        soon as it is final (see `Session`: text the repeat guard may still take back waits);
        the pieces concatenate to `TemplatedOutput.text`. Engine-independent: it sees text only.
        `give_up_below`: stop, with no calls and `gave_up`, as soon as a generated token's
        probability falls below it (`session.GaveUp`).
        `write_value`: another model that may write scalar argument values (see `ValueWriter`);
        what it writes is injected here, what it declines this model writes.
        `alternatives`: write another call where the request lists an alternative to a value the
        calls so far use and none of them uses it (alternatives.py)."""
        start = time.perf_counter()
        vocab = self.vocab(int(step.logits.shape[-1]))
        session = Session(self, vocab, step, teacher=False, draft_source=draft_source, on_text=on_text,
                          give_up_below=give_up_below, write_value=write_value)
        gave_up = False
        try:
            Walker(self, session, require_call, alternatives).calls(list(tools), None)
            session.finish()
            text = session.text
            calls = [Call(d["name"], d["arguments"]) for d in json.loads(text)]
        except GaveUp:
            gave_up, text, calls = True, session.text, []
        n_gen = sum(session.generated)
        return TemplatedOutput(
            gave_up=gave_up,
            calls=calls,
            text=text,
            token_ids=list(session.ids),
            generated_tokens=n_gen,
            injected_tokens=len(session.ids) - n_gen,
            forward_calls=session.forward_calls,
            seconds=time.perf_counter() - start,
            forward_seconds=session.forward_seconds,
            drafted_tokens=session.drafted,
            accepted_draft_tokens=session.accepted,
            rewinds=session.rewinds,
            min_probability=session.min_probability,
        )

    def target(self, calls: Sequence[Call], tools: Sequence[Tool]) -> tuple[list[int], list[bool], list[bool]]:
        """Teacher mode: (ids, generated, trained) for gold `calls`; see `target_token_mask`."""
        session = Session(self, self.vocab(), None, teacher=True)
        Walker(self, session).calls(list(tools), list(calls))
        session.finish()
        return list(session.ids), list(session.generated), list(session.decision)


def _ordered(value: Any, p: Param | None) -> Any:
    if p is not None and p.type == "object" and p.properties and isinstance(value, dict):
        return _ordered_args(value, p.properties, p.required)
    if p is not None and p.type == "array" and isinstance(value, (list, tuple)):
        return [_ordered(x, p.items) for x in value]
    if isinstance(value, tuple):
        return list(value)
    if p is not None and p.is_float and type(value) is int:
        return float(value)  # as the walker writes it
    return value


def _ordered_args(args: dict[str, Any], props: dict[str, Param], required: Sequence[str]) -> dict[str, Any]:
    req = set(required)
    keys = [k for k in props if k in req and k in args] + [k for k in props if k not in req and k in args]
    keys += [k for k in args if k not in props]  # invalid extras kept last (target building rejects them)
    return {k: _ordered(args[k], props.get(k)) for k in keys}


def render_target(calls: Sequence[Call], tools: Sequence[Tool]) -> str:
    """Gold calls in exactly the text the decoder emits: ``json.dumps`` (", " and ": " separators,
    non-ASCII kept) of ``[{"name", "arguments"}]``, arguments (and nested objects with
    properties) ordered required keys first in schema order, then optional keys in schema order;
    integers where the schema declares a float ("float", "double") as floats.
    ``[]`` for no calls. Calls naming tools outside `tools` keep their argument order."""
    by_name = {t.name: t for t in tools}
    out = []
    for c in calls:
        tool = by_name.get(c.name)
        args = _ordered_args(c.arguments, tool.parameters, tool.required) if tool else dict(c.arguments)
        out.append({"name": c.name, "arguments": args})
    return dumps(out)


def target_token_mask(
    backend: Any, calls: Sequence[Call], tools: Sequence[Tool], decoder: TemplateDecoder | None = None
) -> tuple[list[int], list[bool]]:
    """Token ids of `render_target(calls, tools)` segmented exactly as the decoder feeds them, and
    a mask of the tokens whose logits drive the decoder's decisions (put the SFT loss there):
    tokens the model generates (name prefixes up to uniqueness, choices of ``,``/``]``/``}``,
    optional keys, values with their closing quote) and the first token after each peek
    decision (the delimiter ending a number, the ``"`` opening a nullable string, ...).
    Injected boilerplate is False. Raises `TemplateError` when the gold calls are not valid for
    `tools`. Caps (max_calls etc.) are not applied. Pass `decoder` to reuse its vocab tables."""
    dec = decoder or TemplateDecoder(backend)
    ids, _, trained = dec.target(calls, tools)
    return ids, trained
