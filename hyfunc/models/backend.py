"""The transformers engine: a causal language model over torch + transformers (the reference
engine, and the one training uses). The contract and the engine-independent parts are in
`base.py`; the KV state is transformers' `DynamicCache`."""
from __future__ import annotations

import copy
import os
from typing import Any, Sequence

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from hyfunc.config import cpu_flags, threads
from hyfunc.errors import InputError, SetupError
from hyfunc.models import interrupt
from hyfunc.models.base import BackendBase, Generation, PrefixCache, StepOutput
from hyfunc.models.registry import ModelNotAvailable, resolve_model

__all__ = ["Backend", "Generation", "PrefixCache", "StepOutput", "default_device", "default_dtype"]


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
    if device.type == "cuda" or {"amx_bf16", "avx512_bf16"} & cpu_flags():
        return torch.bfloat16
    return torch.float32


def set_threads() -> None:
    """Apply HYFUNC_THREADS (torch's intra-op threads), if set."""
    if count := threads():
        torch.set_num_threads(count)


class Backend(BackendBase):
    engine = "transformers"

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

    def _config_eos(self) -> Any:
        return self.model.generation_config.eos_token_id

    @torch.inference_mode()
    def hidden_of_lines(self, prefix: DynamicCache, lines: list[list[int]]) -> list[torch.Tensor]:
        """Last-layer hidden states (len(line), H) of each line run after a copy of `prefix`, in
        one batch. Lines are right-padded: under causal attention a real token never sees the
        padding after it, so no attention mask is needed and every real position equals what that
        line alone would give."""
        interrupt.check()
        width = max(len(line) for line in lines)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.tensor([line + [pad] * (width - len(line)) for line in lines], device=self.device)
        cache = self.fork(prefix)
        cache.batch_repeat_interleave(len(lines))
        past = prefix.get_seq_length()
        positions = torch.arange(past, past + width, device=self.device).expand(len(lines), -1)
        hidden = self.model.get_decoder()(input_ids=ids, cache=cache, position_ids=positions, use_cache=True).last_hidden_state
        return [hidden[row, : len(line)] for row, line in enumerate(lines)]

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 4096))

    @property
    def description(self) -> str:
        return f"{self.name} on transformers {str(self.model.dtype).removeprefix('torch.')} ({self.device.type}, {torch.get_num_threads()} threads)"

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
        output_hidden: bool = False,
        hidden_to_keep: int | None = None,
    ) -> StepOutput:
        """Run new tokens (ids, or embeddings of shape (len, hidden)) after what `cache` holds.

        The cache is extended in place; pass `fork(cache)` to keep a prefix cache reusable.
        `logits_to_keep` > 1 also returns the logits of that many last positions (`tail_logits`),
        e.g. to verify drafted tokens in one pass. Hidden states come with every pass here
        (`output_hidden` matters to engines where they cost extra); `hidden_to_keep`: those of the
        last N positions only (None: all).
        """
        if (ids is None) == (embeds is None):
            raise ValueError("pass exactly one of ids or embeds")
        interrupt.check()
        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        if ids is not None:
            embeds = self.embed(ids)
        embeds = embeds.to(self.device, self.model.dtype).unsqueeze(0)
        past = cache.get_seq_length()
        positions = torch.arange(past, past + embeds.shape[1], device=self.device).unsqueeze(0)
        out = self.model.get_decoder()(inputs_embeds=embeds, cache=cache, position_ids=positions, use_cache=True)
        hidden = out.last_hidden_state[0]
        kept_hidden = hidden if hidden_to_keep is None else hidden[-hidden_to_keep:]
        # The head gets a 2-D input: given a 3-D slice of several positions and frozen weights
        # (a merged adapter), matmul took a batched path that copied the whole vocabulary matrix
        # on every call (0.6 s of a 0.8 s pass of the 0.5B model). Logit post-processing some
        # model classes add (soft-capping, scaling) is monotonic: greedy choices are unchanged.
        logits = self.model.get_output_embeddings()(hidden[-logits_to_keep:]).float()
        return StepOutput(
            logits=logits[-1], hidden=kept_hidden, cache=out.cache, tail_logits=logits if logits_to_keep > 1 else None
        )

    @staticmethod
    def fork(cache: DynamicCache) -> DynamicCache:
        return copy.deepcopy(cache)
