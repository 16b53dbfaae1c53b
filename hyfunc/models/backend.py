"""A causal language model over torch + transformers, with the hooks the cascade needs.

Besides chat prompting and greedy generation, it exposes last-layer hidden states, input
embeddings (so a continuous "soft" token can be fed in) and a KV cache that can be kept and
reused: `prefill` a fixed prefix once, then `generate(..., cache=...)` appends only new tokens.
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from hyfunc.errors import InputError, SetupError
from hyfunc.models.registry import ModelNotAvailable, resolve_model


@dataclass
class StepOutput:
    logits: torch.Tensor  # (vocab,) logits for the next token after the last input position
    hidden: torch.Tensor  # (seq, hidden) last-layer hidden states of the input positions
    cache: DynamicCache
    tail_logits: torch.Tensor | None = None  # (logits_to_keep, vocab) when more than one was asked for


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    input_tokens: int
    prefill_seconds: float
    decode_seconds: float
    cached_tokens: int = 0  # prompt tokens whose keys/values came from a PrefixCache


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(name: str | None) -> torch.device:
    """`name` ("cpu", "cuda", "cuda:1", ...; None: the default) as a device that exists here."""
    if name is None:
        return torch.device(default_device())
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise InputError(f"unknown device {name!r}; use cpu or cuda (cuda:N for one GPU)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SetupError(f"device {name!r}: no CUDA GPU is visible to torch here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise SetupError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"device {name!r}: hyfunc runs on cpu or cuda")
    return device


def _cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs and on CPUs with native bf16 matmuls (AMX / AVX512-BF16), fp32 elsewhere.

    Measured on the 1.5B model, 800-token prefill: 3.5 s in bf16 vs 9.8 s in fp32 on a CPU with
    AMX; on CPUs without it bf16 is emulated and was ~4x slower than fp32. HYFUNC_DTYPE
    (float32 / bfloat16) overrides the choice.
    """
    if name := os.environ.get("HYFUNC_DTYPE"):
        if name not in ("float32", "bfloat16", "float16"):
            raise InputError(f"HYFUNC_DTYPE={name!r}: use float32, bfloat16 or float16")
        return getattr(torch, name)
    if device.type == "cuda" or {"amx_bf16", "avx512_bf16"} & _cpu_flags():
        return torch.bfloat16
    return torch.float32


def set_threads() -> None:
    """Apply HYFUNC_THREADS (torch's intra-op threads), if set."""
    if threads := os.environ.get("HYFUNC_THREADS"):
        if not threads.isdigit() or int(threads) < 1:
            raise InputError(f"HYFUNC_THREADS={threads!r}: use a positive number of threads")
        torch.set_num_threads(int(threads))


class Backend:
    def __init__(
        self,
        name: str,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ):
        """Load `name` (alias, local path or hub id), or wrap an already built `model`/`tokenizer`."""
        self.name = name
        self.device = resolve_device(device)
        set_threads()
        if model is None:
            path = resolve_model(name)
            dtype = dtype or default_dtype(self.device)
            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            except OSError as err:  # a hub id that is neither cached nor reachable, or broken files
                first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ModelNotAvailable(f"cannot load model {name!r}: {first_line}") from err
        if tokenizer is None:
            raise ValueError("a tokenizer is required when a model object is passed")
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.eos_ids = self._eos_ids()

    def _eos_ids(self) -> set[int]:
        ids = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        for special in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = self.tokenizer.convert_tokens_to_ids(special)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                ids.add(tid)
        return ids

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    # -- prompting -------------------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        """Render chat messages (and OpenAI-style tool dicts) with the model's own chat template."""
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, tokenize=False, add_generation_prompt=True
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        """Input embeddings (len, hidden) of token ids: the space a soft token is inserted into."""
        table = self.model.get_input_embeddings()
        return table(torch.tensor(list(ids), device=self.device))

    # -- forward passes --------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        ids: Sequence[int] | None = None,
        embeds: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
        logits_to_keep: int = 1,
    ) -> StepOutput:
        """Run new tokens (ids, or embeddings of shape (len, hidden)) after what `cache` holds.

        The cache is extended in place; pass `fork(cache)` to keep a prefix cache reusable.
        `logits_to_keep` > 1 also returns the logits of that many last positions (`tail_logits`),
        e.g. to verify drafted tokens in one pass.
        """
        if (ids is None) == (embeds is None):
            raise ValueError("pass exactly one of ids or embeds")
        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        if ids is not None:
            embeds = self.embed(ids)
        embeds = embeds.to(self.device, self.model.dtype).unsqueeze(0)
        past = cache.get_seq_length()
        positions = torch.arange(past, past + embeds.shape[1], device=self.device).unsqueeze(0)
        out = self.model.get_decoder()(inputs_embeds=embeds, cache=cache, position_ids=positions, use_cache=True)
        hidden = out.last_hidden_state[0]
        # The head gets a 2-D input: given a 3-D slice of several positions and frozen weights
        # (a merged adapter), matmul took a batched path that copied the whole vocabulary matrix
        # on every call (0.6 s of a 0.8 s pass of the 0.5B model). Logit post-processing some
        # model classes add (soft-capping, scaling) is monotonic: greedy choices are unchanged.
        logits = self.model.get_output_embeddings()(hidden[-logits_to_keep:]).float()
        return StepOutput(
            logits=logits[-1], hidden=hidden, cache=out.cache, tail_logits=logits if logits_to_keep > 1 else None
        )

    def prefill(self, ids: Sequence[int]) -> DynamicCache:
        """KV cache of a fixed prefix, to be reused with `fork` by many requests."""
        return self.forward(ids=ids).cache

    @staticmethod
    def fork(cache: DynamicCache) -> DynamicCache:
        return copy.deepcopy(cache)

    # -- generation ------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        ids: Sequence[int] | None = None,
        embeds: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
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

    def __init__(self, backend: Backend):
        self.backend = backend
        self._ids: list[int] = []
        self._cache: DynamicCache | None = None

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
        step = self.backend.forward(ids=ids[shared:], cache=cache)
        self._ids, self._cache = ids, step.cache
        return step, shared
