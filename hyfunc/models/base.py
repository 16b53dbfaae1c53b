"""What every engine gives the methods and the cascade: the `Backend` contract and the parts of it
that do not depend on the engine (chat prompts, greedy generation, prefix reuse).

An engine implements `forward` (run ids or input embeddings after a KV state; logits of the last
positions, last-layer hidden states when asked), `embed` (input embeddings of ids), `fork` (an
independent copy of a KV state), `hidden_of_lines` (several continuations of one prefix in one
batch) and `hidden_size`. A KV state is whatever the engine keeps; it answers `get_seq_length()`
and `crop(-n)` (drop the last n positions), as transformers' `Any` does. Tokenization and
chat templates come from the model's Hugging Face tokenizer on every engine, so token ids, the
templating decoder's vocabulary tables and prompts are the same whichever engine runs the model.
Engines: `backend.py` (torch + transformers: the reference, and training), `llamacpp.py` (GGUF on
CPUs). A GPU engine (vLLM, SGLang) would be one more file behind this contract.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Protocol, Sequence

import jinja2
import torch

from hyfunc.formats.messages import call_arguments, call_name, content_text, has_tool_turns, plain_chat


class KVState(Protocol):
    def get_seq_length(self) -> int: ...

    def crop(self, max_length: int) -> None:
        """A negative `max_length` drops that many positions from the end."""


@dataclass
class StepOutput:
    logits: torch.Tensor  # (vocab,) logits for the next token after the last input position
    hidden: torch.Tensor | None  # (seq, hidden) last-layer hidden states of the input positions (when asked)
    cache: Any  # the engine's KV state (see KVState)
    tail_logits: torch.Tensor | None = None  # (logits_to_keep, vocab) when more than one was asked for


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    input_tokens: int
    prefill_seconds: float
    decode_seconds: float
    cached_tokens: int = 0  # prompt tokens whose keys/values came from a PrefixCache


class BackendBase:
    """The engine-independent half of a backend. Subclasses set `name`, `tokenizer` and `eos_ids`
    and implement `forward`, `embed`, `fork`, `hidden_of_lines` and `hidden_size`."""

    name: str
    tokenizer: Any
    eos_ids: set[int]
    engine: str = "?"

    def forward(
        self, ids: Sequence[int] | None = None, embeds: torch.Tensor | None = None, cache: Any = None,
        logits_to_keep: int = 1, output_hidden: bool = False, hidden_to_keep: int | None = None,
    ) -> StepOutput:
        raise NotImplementedError

    def fork(self, cache: Any) -> Any:
        raise NotImplementedError

    @property
    def context_length(self) -> int:
        """Tokens one prompt and its answer may hold."""
        raise NotImplementedError

    def _eos_ids(self) -> set[int]:
        ids = set()
        for source in (self._config_eos(), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        for special in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = self.tokenizer.convert_tokens_to_ids(special)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                ids.add(tid)
        return ids

    def _config_eos(self) -> Any:
        return None

    # -- prompting -------------------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        """Render chat messages (and OpenAI-style tool dicts) with the model's own chat template.
        Tool calls and results go in as the template renders them; a template that cannot (it
        raises, or leaves a call or a result out) gets them as plain turns (`formats.messages.plain_chat`)."""
        messages = [_with_dict_arguments(m) for m in messages]
        render = partial(self.tokenizer.apply_chat_template, tools=list(tools) if tools else None, tokenize=False,
                         add_generation_prompt=True)
        if not has_tool_turns(messages):
            return render(messages)
        try:
            text = render(messages)
        except jinja2.TemplateError:
            return render(plain_chat(messages))
        shown = [content_text(m.get("content")) for m in messages if m.get("role") == "tool"]
        shown += [call_name(c) for m in messages for c in m.get("tool_calls") or []]
        return text if all(piece in text for piece in shown) else render(plain_chat(messages))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def prefill(self, ids: Sequence[int]) -> Any:
        """KV cache of a fixed prefix, to be reused with `fork` by many requests."""
        return self.forward(ids=ids).cache

    # -- generation ------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        ids: Sequence[int] | None = None,
        embeds: torch.Tensor | None = None,
        cache: Any | None = None,
        max_new_tokens: int = 256,
        stop: Callable[[str], bool] | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> Generation:
        """Greedy decoding after a prompt (ids or embeddings), optionally after a reused cache.

        With `prefix_cache`, the prompt ids it shares with the previous prompt are not run again.
        Stops at an end-of-sequence token, after `max_new_tokens`, or as soon as `stop(text)`
        is true for the text generated so far.
        """
        start = time.perf_counter()
        cached_tokens = 0
        if prefix_cache is not None:
            if ids is None or cache is not None:
                raise ValueError("prefix_cache works on token ids, without an explicit cache")
            step, cached_tokens = prefix_cache.run(ids)
        else:
            step = self.forward(ids=ids, embeds=embeds, cache=cache)
        input_tokens = len(ids) if ids is not None else int(embeds.shape[0])
        prefill_done = time.perf_counter()
        generated: list[int] = []
        while True:
            token = int(torch.argmax(step.logits))
            if token in self.eos_ids:
                break
            generated.append(token)
            if len(generated) >= max_new_tokens or (stop is not None and stop(self.decode(generated))):
                break
            step = self.forward(ids=[token], cache=step.cache)
        return Generation(
            text=self.decode(generated),
            token_ids=generated,
            input_tokens=input_tokens,
            prefill_seconds=prefill_done - start,
            decode_seconds=time.perf_counter() - prefill_done,
            cached_tokens=cached_tokens,
        )


class PrefixCache:
    """Reuses the KV cache of the previous prompt for the token prefix a new prompt shares with it.

    Exact: the same ids at the same positions give the same keys and values. With a fixed tool
    library in the system prompt, the library is read once and each request runs only its own
    tokens. The stored cache is the live one (decoding appends to it); the next `run` crops it back
    to the shared prefix, so nothing is copied. Not thread-safe: one request at a time.
    """

    def __init__(self, backend: BackendBase):
        self.backend = backend
        self._ids: list[int] = []
        self._cache: Any | None = None

    def run(self, ids: Sequence[int]) -> tuple[StepOutput, int]:
        """Forward `ids`; returns the step after the last id and how many ids were reused."""
        ids = list(ids)
        shared = 0
        for old, new in zip(self._ids, ids[:-1]):  # keep >= 1 new id: its logits are needed
            if old != new:
                break
            shared += 1
        cache = None
        if shared and self._cache is not None:
            cache = self._cache
            excess = cache.get_seq_length() - shared
            if excess:
                cache.crop(-excess)  # transformers 5 crops by a negative count of tokens to drop
        else:
            shared = 0
        # What the cache holds now, should the pass not run (a given-up request: models/interrupt.py).
        self._ids, self._cache = ids[:shared], cache
        step = self.backend.forward(ids=ids[shared:], cache=cache)
        self._ids, self._cache = ids, step.cache
        return step, shared


def _with_dict_arguments(message: dict) -> dict:
    """Templates render a call's arguments with `tojson`: the wire form (a JSON string) would be
    quoted twice."""
    if not message.get("tool_calls"):
        return message
    calls = [{**c, "function": {**c.get("function", {}), "arguments": call_arguments(c)}} for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}
