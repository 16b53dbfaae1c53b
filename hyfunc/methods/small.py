"""The small path: what a routed request runs. No large-model pass.

Per request:
  1. the selector (hyfunc.cascade.selector: BM25 + MiniLM, calibrated) keeps the offered tools
     that fit the request, or none ("no tool fits" -> no call, the small model is not run);
  2. the small model reads [instruction + selected tools + request] (the cascade's small prompt
     without the soft-token slot) through a prefix cache, so the instruction, and the tools when
     the same ones were selected as for the previous request, are not run again (exact);
  3. the templating decoder writes the calls, generating only what the schemas leave open.

The small model is typically the cascade's own (same weights, same prompt format), distilled on
the large path's answers by `hyfunc odia cycle`; its LoRA adapter travels with each version.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

from hyfunc.cascade.selector import ToolSelector
from hyfunc.cascade.small_model import build_small_prompt
from hyfunc.cascade.templating import TemplateDecoder
from hyfunc.errors import InputError
from hyfunc.formats.messages import conversation_text
from hyfunc.formats.schema import Tool
from hyfunc.methods.base import Answer
from hyfunc.models.base import BackendBase, PrefixCache

RANKING_SHOWN = 32
# An offered tool the selector left out but scored within this of its selection threshold "nearly
# fits": the request may also ask for it (a small-first router escalates an answer that repeats one
# tool while another nearly fits). Chosen on fc-train validation with the shipped selector: of its
# multi-call requests, the selector missed a tool the gold answer calls in 20, 15 of them within
# 1.5; of the 7 that call one tool several times, 2 have another tool that close.
NEAR_FIT_MARGIN = 1.5


class SmallMethod:
    """A `Method`. `backend` (not `small`) names the model: for the server this path is one model
    that also writes its text replies and forced calls."""

    path = "small"

    def __init__(self, backend: BackendBase, selector: ToolSelector, name: str = "small", version: str | None = None):
        self.backend, self.selector = backend, selector
        self.decoder = TemplateDecoder(backend)
        self._prefix = PrefixCache(backend)
        self.version = version
        self.name = name if version is None else f"{name}@{version}"
        self.config: dict = {"small": f"{backend.name} ({backend.engine})", "version": version,
                             "selector": selector.retriever.meta.get("embedder")}

    def answer(self, messages: Sequence[dict], tools: Sequence[Tool], give_up_below: float = 0.0) -> Answer:
        """`give_up_below`: stop writing, with no calls and ``details["gave_up"]``, once a value
        token's probability falls below it (a small-first router's confidence floor)."""
        tools = list(tools)
        request = conversation_text(messages)
        if not request:
            raise InputError("the request has no user message")
        timings: dict[str, float] = {}
        start = time.perf_counter()
        scores, answerable = self.selector.rank(request, tools)
        chosen = self.selector.retriever.select_from_scores(scores, answerable) if tools else []
        timings["select"] = time.perf_counter() - start
        ranking = torch.argsort(scores, descending=True, stable=True)[:RANKING_SHOWN].tolist() if tools else []
        near = self.selector.retriever.config.threshold - NEAR_FIT_MARGIN
        answer = Answer(calls=[], timings=timings, details={
            "path": self.path, "retrieved": [tools[i].name for i in chosen],
            "ranking": [tools[i].name for i in ranking], "scores": [round(float(scores[i]), 4) for i in ranking],
            "answerability": answerable,
            "near_fit": [tools[i].name for i in ranking if i not in chosen and float(scores[i]) >= near] if chosen else [],
        })
        if not chosen:
            # No tool fits: the selector's decision, as in the cascade. A small-first router sends it
            # to the cascade (hyfunc.routing.router.SMALL_REFUSED); the model wrote nothing to be confident in.
            answer.details["confidence"] = 0.0
            return answer
        selected = [tools[i] for i in chosen]
        start = time.perf_counter()
        prompt = build_small_prompt(self.backend, request, selected, with_soft_token=False)
        step, reused = self._prefix.run(prompt.before_ids)
        timings["small_prefill"] = time.perf_counter() - start
        start = time.perf_counter()
        # Tools were selected: the model writes at least one call, and one for each alternative the
        # request lists for a value (as the cascade's small model does).
        out = self.decoder.decode(step, selected, require_call=True, draft_source=request, give_up_below=give_up_below,
                                  alternatives=True)
        timings["small_decode"] = time.perf_counter() - start
        answer.calls, answer.raw_text = out.calls, out.text
        answer.input_tokens, answer.cached_tokens = len(prompt), reused
        answer.output_tokens, answer.injected_tokens = out.generated_tokens, out.injected_tokens
        answer.details["small_forward_passes"] = out.forward_calls
        answer.details["confidence"] = out.min_probability  # mining keeps it as a routing feature
        if out.gave_up:
            answer.details["gave_up"] = True
        return answer
