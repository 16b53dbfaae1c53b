"""The template itself: the call list, each call's arguments and each value, from the schemas.

One code path serves decoding (model mode) and target building (teacher mode, where `gold`
values drive every decision). The walker decides what is injected (names once unique, keys,
punctuation) and what the model chooses (a tool, another call, optional keys, values under their
type's constraints: string, integer, number, boolean, enum, null, arrays, objects, free JSON).
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from hyfunc.cascade.templating.alternatives import uncovered_in_text
from hyfunc.cascade.templating.drafting import DECISION, Follow, mention_order
from hyfunc.cascade.templating.session import Session, TemplateError
from hyfunc.cascade.templating.vocab import NUMBER_ACCEPT
from hyfunc.formats.calls import Call
from hyfunc.formats.grounding import described_examples
from hyfunc.formats.schema import Param, Tool
from hyfunc.formats.validate import TYPE_CHECKS

if TYPE_CHECKING:
    from hyfunc.cascade.templating.decoder import TemplateDecoder

_MISSING = object()


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class Walker:
    """Walks the template; `gold` arguments are only used (and required) in teacher mode."""

    def __init__(self, dec: TemplateDecoder, s: Session, require_call: bool = False, alternatives: bool = False):
        self.dec = dec
        self.s = s
        self.require_call = require_call
        self.alternatives = alternatives and not s.teacher  # see alternatives.py
        self.v = s.vocab
        self.teacher = s.teacher

    # -- top level -------------------------------------------------------------------------
    def calls(self, tools: Sequence[Tool], gold: Sequence[Call] | None) -> None:
        s = self.s
        s.inject("[")
        by_name = {t.name: t for t in tools}
        if self.teacher:
            for c in gold:
                if c.name not in by_name:
                    raise TemplateError(f"gold call names {c.name!r}, not among the offered tools")
        if not tools:
            s.inject("]")
            return
        names = [dumps(t.name)[1:] for t in tools]  # name content + closing quote
        opener = '{"name": "'
        separator = [", " + opener, "]"]
        # Guesses drafted in model mode: the tools in the order the request likely calls them
        # (the first not called yet comes next, else the last again), and what the decoder
        # feeds after each name up to the first value or key choice.
        order = mention_order(tools, s.draft_source) if not self.teacher else list(range(len(tools)))
        heads = [self._object_head(t.parameters, t.required, Follow("}")).after(', "arguments": ') for t in tools]
        called: list[int] = []

        def guesses() -> list[int]:
            return [j for j in order if j not in called] + called[::-1]

        def next_call() -> Follow:
            """What follows the opener of the next call, as guessed."""
            if len(tools) == 1:  # the name is injected with the opener's rest
                return heads[0].after(names[0])
            g = guesses()[0]
            return Follow(then=tuple(s.choice_path(names, "", g, heads[g]))) if not self.teacher else DECISION

        n = 0
        if self.require_call and not self.teacher:
            s.inject(opener)
        elif s.choose([opener, "]"], (0 if gold else 1) if self.teacher else None, (0, 1), [next_call(), DECISION]):
            return
        written: list[str] = []  # the calls so far, as JSON text
        forced: list[str] = []  # alternatives another call was written for (alternatives.py)
        guard = not self.teacher and self.dec.stop_on_repeat
        before_separator = hold = None
        while True:
            start = len(s.text) - len(opener)
            if hold is not None:
                hold.item_start = start
            g = gold[n] if self.teacher else None
            i = s.choose(names, [t.name for t in tools].index(g.name) if g is not None else None, guesses(), heads)
            called.append(i)
            tool = tools[i]
            s.inject(', "arguments": ')
            more = len(set(called)) < len(tools)  # the guess: another call while a tool is left
            upcoming = next_call()  # the same guess wherever the separator gets drafted
            then = []
            if not self.teacher:
                then = s.choice_path(separator, "", 0 if more else 1, upcoming if more else DECISION)
            arguments = g.arguments if g is not None else _MISSING
            self.object_props(tool.parameters, tool.required, arguments, tool.name, Follow("}", tuple(then)))
            s.inject("}")
            if guard and self._closed_on_repeat(s.text[start:], written, before_separator, hold):
                return
            n += 1
            if n >= self.dec.max_calls and not self.teacher:
                s.inject("]")
                return
            before_separator = s.mark() if not self.teacher else None
            hold = s.hold(before_separator, written) if guard else None
            alternative = uncovered_in_text(s.draft_source, s.text, forced) if self.alternatives else None
            if alternative is not None:
                forced.append(alternative)
                s.inject(separator[0])
                continue
            gold_choice = (0 if n < len(gold) else 1) if self.teacher else None
            if s.choose(separator, gold_choice, (0, 1) if more else (1, 0), [upcoming, DECISION]) == 1:
                s.release(hold)
                return

    def _closed_on_repeat(self, text: str, written: list[str], before_separator: tuple | None, hold: Any) -> bool:
        """A list element (a call, an array item) word for word an earlier one: greedy decoding has
        entered a loop (it would go on to the cap). The repeat is taken back to `before_separator`
        and the list closed (True); otherwise `text` joins `written` and the text after
        `before_separator` is final (its `hold` released)."""
        if text in written:
            self.s.rewind(before_separator)
            self.s.inject("]")
            return True
        self.s.release(hold)
        written.append(text)
        return False

    # -- values ----------------------------------------------------------------------------
    def object_props(
        self, props: dict[str, Param], required: Sequence[str], gold: Any, where: str, follow: Follow = DECISION
    ) -> None:
        """`follow`: what the decoder feeds after this object (see `value`)."""
        s = self.s
        if self.teacher:
            if not isinstance(gold, dict):
                raise TemplateError(f"{where}: expected an object, got {gold!r}")
            unknown = [k for k in gold if k not in props]
            if unknown:
                raise TemplateError(f"{where}: unknown argument(s) {unknown}")
            missing = [k for k in required if k not in gold]
            if missing:
                raise TemplateError(f"{where}: missing required argument(s) {missing}")
        req = set(required)
        s.inject("{")
        keys = [k for k in props if k in req]
        remaining = [k for k in props if k not in req]

        def key_options(first: bool) -> list[str]:
            return [("" if first else ", ") + dumps(k) + ": " for k in remaining] + ["}"]

        def after_last() -> Follow:
            """What follows the value before the optional keys `remaining`: the object's end,
            directly or (guessed) chosen over them."""
            if not remaining:
                return follow.after("}")
            if self.teacher:
                return DECISION
            return Follow(then=tuple(s.choice_path(key_options(False), "", len(remaining), follow)))

        for i, k in enumerate(keys):
            s.inject(("" if i == 0 else ", ") + dumps(k) + ": ")
            if i + 1 < len(keys):
                after = Follow(", " + dumps(keys[i + 1]) + ": " + self._opening(props[keys[i + 1]]))
            else:
                after = after_last()
            self.value(props[k], gold[k] if self.teacher else _MISSING, f"{where}.{k}", follow=after)
        first = not keys
        while remaining:
            opts = key_options(first)
            g = None
            if self.teacher:
                g = next((j for j, k in enumerate(remaining) if k in gold), len(remaining))
            # Guessed: no more optional keys.
            j = s.choose(opts, g, [len(remaining), *range(len(remaining))], [DECISION] * len(remaining) + [follow])
            if j == len(remaining):
                return
            k = remaining[j]
            remaining = remaining[j + 1:]
            self.value(props[k], gold[k] if self.teacher else _MISSING, f"{where}.{k}", follow=after_last())
            first = False
        s.inject("}")

    def _choice_options(self, p: Param) -> list[tuple[str, Any]] | None:
        """(JSON text, value) options for enum/boolean params, None for other params."""
        nullable = p.has_default and p.default is None
        if p.enum is not None:
            check = TYPE_CHECKS.get(p.type, lambda v: True)
            members = [v for v in p.enum if check(v)] or list(p.enum)
            opts = []
            for v in members + ([None] if nullable and None not in members else []):
                t = dumps(v)
                if all(t != o for o, _ in opts):
                    opts.append((t, v))
            return opts
        if p.type == "boolean":
            return [("true", True), ("false", False)] + ([("null", None)] if nullable else [])
        return None

    def start_mask(self, p: Param | None, depth: int = 0) -> torch.Tensor:
        """Tokens that can start a value of schema `p` (None: any JSON value)."""
        v = self.v
        if p is None or p.type == "any" or (p.type == "object" and not p.properties):
            if p is not None and p.type == "object":
                return v.starts["{"]
            m = v.starts['"'] | v.number_step(False, "start")[0] | v.mask_of(v.prefix_ids(["true", "false", "null"]))
            if depth < self.dec.max_any_depth:
                m = m | v.starts["["] | v.starts["{"]
            return m
        opts = self._choice_options(p)
        if opts is not None:
            return v.mask_of(v.prefix_ids([o for o, _ in opts]))
        m = {
            "string": v.starts['"'],
            "integer": v.number_step(True, "start")[0],
            "number": v.number_step(False, "start")[0],
            "array": v.starts["["],
            "object": v.starts["{"],
        }[p.type]
        if p.has_default and p.default is None:
            m = m | v.mask_of(v.prefix_ids(["null"]))
        return m

    def _object_head(self, props: dict[str, Param], required: Sequence[str], follow: Follow) -> Follow:
        """What `object_props` feeds first: up to the first value or key choice, or the whole
        empty object and `follow`."""
        first = next((k for k in props if k in set(required)), None)
        if first is not None:
            return Follow("{" + dumps(first) + ": " + self._opening(props[first]))
        return Follow("{") if props else follow.after("{}")

    @staticmethod
    def _opening(p: Param) -> str:
        """The text a value of `p` surely starts with, injected before any decision."""
        plain_string = p.type == "string" and p.enum is None and not (p.has_default and p.default is None)
        return '"' if plain_string else ""

    def value(self, p: Param | None, gold: Any, where: str, depth: int = 0, follow: Follow = DECISION) -> None:
        """`follow`: what the decoder feeds right after this value if the guesses hold (see
        `Follow`); string and number drafts run into it."""
        s = self.s
        if p is None or p.type == "any" or (p.type == "object" and not p.properties):
            if self.teacher and p is not None and p.type == "object" and not isinstance(gold, dict):
                if not (gold is None and p.has_default and p.default is None):
                    raise TemplateError(f"{where}: expected an object, got {gold!r}")
            if p is not None and p.type == "object" and not (p.has_default and p.default is None):
                self.free_object(gold, where, depth)
            else:
                self.any_value(gold, where, depth, only_object=p is not None and p.type == "object")
            return
        opts = self._choice_options(p)
        if opts is not None:
            g = None
            if self.teacher:
                g = next((i for i, (_, val) in enumerate(opts) if _same(val, gold)), None)
                if g is None:
                    raise TemplateError(f"{where}: {gold!r} is not among {[o for o, _ in opts]}")
            texts = [o for o, _ in opts]
            if p.enum is not None and s.write_value is not None:
                chosen = s.write_value.choice(s.text, texts)
                if chosen is not None:
                    s.inject(texts[chosen])
                    return
            s.choose(texts, g)
            return
        if p.has_default and p.default is None:
            null_mask = self.v.mask_of(self.v.prefix_ids(["null"]))
            body = {
                "string": self.v.starts['"'],
                "integer": self.v.number_step(True, "start")[0],
                "number": self.v.number_step(False, "start")[0],
                "array": self.v.starts["["],
                "object": self.v.starts["{"],
            }[p.type]
            if s.peek([null_mask, body], (0 if gold is None else 1) if self.teacher else None) == 0:
                s.choose(["null"], 0)
                return
        if self.teacher and not TYPE_CHECKS[p.type](gold):
            raise TemplateError(f"{where}: expected {p.type}, got {gold!r}")
        if p.type == "string":
            self.string(gold, follow, value=True, description=p.description)
        elif p.type in ("integer", "number"):
            start = len(s.text)
            self.number(p.type == "integer", gold, where, follow, value=True)
            if p.is_float and not any(ch in ".eE" for ch in s.text[start:]):
                # A declared float is written as one: "1" would read back as an integer, which
                # BFCL's checker rejects inside a list of floats (and a typed caller may too).
                s.inject(".0")
        elif p.type == "array":
            self.array(p.items, gold, where, depth)
        else:
            self.object_props(p.properties, p.required, gold, where, follow)

    def string(self, gold: Any, follow: Follow = DECISION, value: bool = False, description: str = "") -> None:
        """`value`: an argument's value (not an object key), which the session's `write_value`
        (the large model) may write instead of the model, in the form `description` shows."""
        s = self.s
        s.inject('"')
        if value and s.write_value is not None:
            head, examples = s.text, described_examples(description)
            if self.written_value(  # the content and the closing quote
                lambda draft: s.write_value.string(head, draft.removesuffix('"') if draft is not None else None, examples),
                lambda: self.string_content(gold, follow), lambda written: dumps(written)[1:],
            ):
                return
        self.string_content(gold, follow)

    def string_content(self, gold: Any, follow: Follow = DECISION) -> None:
        """A string's content and its closing quote, written by the model."""
        s, v = self.s, self.v
        target = dumps(gold)[1:] if self.teacher else None  # content + closing quote
        n, state = 0, 0
        with s.drafting("string", follow):
            while True:
                if self.teacher or n < self.dec.max_string_tokens:
                    allowed = v.str_any[state]
                else:  # over the cap: close now (after finishing an open escape)
                    allowed = v.str_closing[0] if state == 0 else v.str_safe[1]
                piece = s.step(allowed, target)
                tid = s.ids[-1]
                n += 1
                if self.teacher:
                    target = target[len(piece):]
                if v.str_closing[state][tid]:
                    return  # a closing token: content (maybe empty) then the quote
                s.value_so_far += piece
                state = 1 if v.str_open[state][tid] else 0

    def written_value(
        self, write: Callable[[str | None], str | None], model_writes: Callable[[], None], spelled: Callable[[str], str]
    ) -> bool:
        """Whether the session's `write_value` wrote this value (else the model writes it). `write(draft)`
        asks it (`draft` None: without one), `model_writes()` has the model write the value,
        `spelled(written)` is the text the writer's value is emitted as. With the writer's
        `model_drafts`, the model writes the value first, kept back from streaming, and its text is
        the writer's draft: the writer's value is the same, found in fewer passes. Where the model's
        text spells it, that text stands; where not, it is taken back and the writer's injected."""
        s = self.s
        if not s.write_value.model_drafts:
            written = write(None)
            if written is not None:
                s.inject(spelled(written))
            return written is not None
        mark, start, lowest = s.mark(), len(s.text), s.min_probability
        with s.keep_back():
            model_writes()
            drafted = s.text[start:]
            written = write(drafted)
            if written is None:
                return True  # declined: the model's value stands, as the model would have written it anyway
            s.min_probability = lowest  # the writer's value: not the model's confidence
            if spelled(written) != drafted:
                s.rewind(mark, repeat=False)
                s.inject(spelled(written))
        return True

    def number(self, integer: bool, gold: Any, where: str, follow: Follow = DECISION, value: bool = False) -> None:
        """`value`: a typed argument's value, which the session's `write_value` may write."""
        s, v = self.s, self.v
        if value and s.write_value is not None:
            head = s.text
            if self.written_value(
                lambda draft: s.write_value.number(head, integer, draft),
                lambda: self.number(integer, gold, where, follow), lambda written: written,
            ):
                return
        target = None
        if self.teacher:
            if isinstance(gold, float) and not math.isfinite(gold):
                raise TemplateError(f"{where}: {gold!r} has no JSON spelling")
            target = dumps(gold)
        state, length = "start", 0
        with s.drafting("number", follow):
            while True:
                mask, nxt = v.number_step(integer, state)
                if state in NUMBER_ACCEPT:
                    if length >= self.dec.max_number_chars and not self.teacher:
                        return
                    if s.peek([mask, v.terminators], (1 if not target else 0) if self.teacher else None) == 1:
                        return
                    s.decision_pending = False  # continuing: the next token is generated
                piece = s.step(mask, target)
                tid = s.ids[-1]
                state = nxt[tid]
                length += len(piece)
                s.value_so_far += piece
                if self.teacher:
                    target = target[len(piece):]

    def array(self, items: Param | None, gold: Any, where: str, depth: int) -> None:
        s = self.s
        s.inject("[")
        start = self.start_mask(items, depth + 1)
        if s.peek([self.v.starts["]"], start], (0 if not gold else 1) if self.teacher else None) == 0:
            s.inject("]")
            return
        guard = not self.teacher and self.dec.stop_on_repeat
        written: list[str] = []  # the items so far that a loop would repeat: strings, objects, arrays
        before_separator = hold = None
        n = 0
        while True:
            item_start = len(s.text)
            if hold is not None:
                hold.item_start = item_start
            self.value(items, gold[n] if self.teacher else _MISSING, f"{where}[{n}]", depth + 1)
            item = s.text[item_start:]
            # Numbers and booleans may repeat on purpose ([1, 1, 2]); strings, objects and arrays not.
            if guard and item[:1] in '"{[':
                if self._closed_on_repeat(item, written, before_separator, hold):
                    return
            else:
                s.release(hold)
            n += 1
            if n >= self.dec.max_array_items and not self.teacher:
                s.inject("]")
                return
            before_separator = s.mark() if guard else None
            hold = s.hold(before_separator, written) if guard else None
            if s.choose([", ", "]"], (0 if n < len(gold) else 1) if self.teacher else None) == 1:
                s.release(hold)
                return

    def free_object(self, gold: Any, where: str, depth: int) -> None:
        s = self.s
        s.inject("{")
        keys = list(gold) if self.teacher else []
        if self.teacher and not all(isinstance(k, str) for k in keys):
            raise TemplateError(f"{where}: object keys must be strings")
        if s.peek([self.v.starts["}"], self.v.starts['"']], (0 if not keys else 1) if self.teacher else None) == 0:
            s.inject("}")
            return
        n = 0
        while True:
            key = keys[n] if self.teacher else _MISSING
            self.string(key)
            s.inject(": ")
            self.any_value(gold[key] if self.teacher else _MISSING, f"{where}.{key if self.teacher else '*'}", depth + 1)
            n += 1
            if n >= self.dec.max_array_items and not self.teacher:
                s.inject("}")
                return
            if s.choose([", ", "}"], (0 if n < len(keys) else 1) if self.teacher else None) == 1:
                return

    def any_value(self, gold: Any, where: str, depth: int, only_object: bool = False) -> None:
        s, v = self.s, self.v
        alts = [v.starts['"'], v.number_step(False, "start")[0], v.mask_of(v.prefix_ids(["true", "false", "null"]))]
        if depth < self.dec.max_any_depth:
            alts += [v.starts["["], v.starts["{"]]
        g = None
        if self.teacher:
            if isinstance(gold, str):
                g = 0
            elif isinstance(gold, bool) or gold is None:
                g = 2
            elif isinstance(gold, (int, float)):
                g = 1
            elif isinstance(gold, (list, tuple)):
                g = 3
            elif isinstance(gold, dict):
                g = 4
            if g is None or g >= len(alts):
                raise TemplateError(f"{where}: cannot write {gold!r} (too deep or not JSON)")
        if only_object:  # a nullable free object: null or an object
            alts = [v.mask_of(v.prefix_ids(["null"])), v.starts["{"]]
            g = (0 if gold is None else 1) if self.teacher else None
            if s.peek(alts, g) == 0:
                s.choose(["null"], 0)
            else:
                self.free_object(gold, where, depth)
            return
        k = s.peek(alts, g)
        if k == 0:
            self.string(gold)
        elif k == 1:
            self.number(False, gold, where)
        elif k == 2:
            opts = ["true", "false", "null"]
            s.choose(opts, opts.index(dumps(gold)) if self.teacher else None)
        elif k == 3:
            self.array(None, gold, where, depth)
        else:
            self.free_object(gold, where, depth)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (dumps(a) == dumps(b))
