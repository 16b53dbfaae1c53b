"""The online cascade: large model -> soft token -> retriever -> small model + dynamic templating.

Per request:
  1. one forward pass of the large model over [instruction + tools + request]
     (or only the request, after a cached fixed library) -> soft token + function embeddings;
  2. the retriever keeps the relevant tools, or none ("no tool fits" -> no call), by the soft
     token's cosine with each tool plus a weighted lexical score of the request (lexical.py);
  3. the small model reads [instruction + retrieved tools + request + projected soft token] and
     the templating decoder writes the call list, generating only what the schemas leave open;
     scalar values (free strings, enum members, numbers) are written by the large model,
     continuing its state of step 1 with the answer so far (when step 1 read the tools;
     large_values.py).

An artifact directory (written by `hyfunc prepare`) holds what was trained::

    manifest.json        models, data hash, hyper-parameters, metrics
    retriever/           manifest.json + retriever.safetensors
    projector.safetensors, projector.json
    adapter/             LoRA adapter of the small model (peft), optional
    library_retriever/   retriever for a large library in per-function mode, optional
    off_topic/           the off-topic gate (cascade/off_topic.py), optional
    next_step/           answer or call after tool results (cascade/next_step.py), optional
    after_results/       the small model's adapter and projector for the calls after tool results
                         (cascade/after_results.py), optional

After tool results (an agent loop's next turn), the large model reads the conversation in its
own chat template, and the artifact's next-step head (`next_step/`, cascade/next_step.py) decides
from that pass whether the request is done: then no call is made and the server writes the answer
from the results; otherwise a call is due, and the retriever only picks the tools for it.

On a follow-up (a user message after earlier turns) the off-topic gate and the refusal head read
the new message alone (one more short pass of the large model), the ranking the conversation's
pass: both learned first requests, and read any conversation after an on-topic request as on-topic.

With an off-topic gate in the artifact, small talk and general questions are refused after step 1
when both its detectors agree (MiniLM finds no offered tool close, the soft token reads off-topic),
and before it, with no large-model pass, when an English request is far from every offered tool.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from hyfunc.cascade.after_results import SmallWriter, load_after_results
from hyfunc.cascade.large_values import LargeValueWriter
from hyfunc.cascade.lexical import lexical_scores
from hyfunc.cascade.library import DISK_CACHE_BYTES, LibraryEmbedding, PerFunctionLibrary, embeddings_stored
from hyfunc.cascade.manifest import MANIFEST
from hyfunc.cascade.next_step import NEXT_STEP_DIR, NextStepHead
from hyfunc.cascade.off_topic import GATE_DIR, OffTopicGate
from hyfunc.cascade.retriever import Retriever
from hyfunc.cascade.small_model import (
    SmallPrompt,
    SoftTokenProjector,
    build_small_prompt,
    load_projector,
    prompt_embeds,
)
from hyfunc.cascade.soft_token import Encoding, LibraryCache, SharedLargePass, SoftTokenEncoder
from hyfunc.cascade.templating import TemplateDecoder, TemplatedOutput
from hyfunc.errors import InputError
from hyfunc.formats.calls import CallParseError, parse_calls
from hyfunc.formats.messages import conversation_text, ends_with_tool_results, follow_up_alone
from hyfunc.formats.schema import Tool
from hyfunc.methods.base import Answer, calls_text
from hyfunc.methods.cascade_options import CascadeOptions
from hyfunc.models.base import BackendBase, PrefixCache, StepOutput
from hyfunc.models.engines import load_backend, resolve_engine

RANKING_SHOWN = 32  # tools listed, best first, in an answer's details
#: The trained default cascade shipped inside the package (made by `hyfunc prepare`, see its manifest).
DEFAULT_ARTIFACT = Path(__file__).resolve().parents[1] / "data" / "cascade"


@dataclass
class LibraryState:
    """What `HyFuncMethod.use_library` computed for one tool library: the large model's KV cache of
    [instruction + tools] and the function embeddings (joint mode), or the per-function embeddings
    and lexical index (per-function mode). A server keeps several and swaps them in with
    `set_library_state`; treat it as opaque."""

    tools: list[Tool]
    joint: LibraryCache | None = None
    per_function: PerFunctionLibrary | None = None


def _with_decoded(answer: Answer, out: TemplatedOutput, passes: str) -> Answer:
    """`answer` with the templating decoder's calls and counts (`passes`: whose forward passes)."""
    answer.calls, answer.raw_text = out.calls, out.text
    answer.output_tokens, answer.injected_tokens = out.generated_tokens, out.injected_tokens
    answer.details[passes] = out.forward_calls
    answer.details["accepted_draft_tokens"] = out.accepted_draft_tokens
    return answer


def _request_text(messages: Sequence[dict]) -> str:
    if not any(m.get("role") == "user" for m in messages):
        raise InputError("the request has no user message")
    return conversation_text(messages)


class HyFuncMethod:
    def __init__(
        self,
        large: BackendBase,
        small: BackendBase,
        retriever: Retriever,
        projector: SoftTokenProjector | None,
        options: CascadeOptions | None = None,
        name: str = "hyfunc",
        shared_pass: SharedLargePass | None = None,
        library_retriever: Retriever | None = None,
        gate: OffTopicGate | None = None,
        next_step: NextStepHead | None = None,
        after_results: SmallWriter | None = None,
    ):
        self.large, self.small = large, small
        self.next_step = next_step  # after tool results: answer in text, or go on to a call
        self.after_results = after_results  # writes the calls after tool results, if given
        self.encoder = SoftTokenEncoder(large)
        self.retriever = retriever
        self.library_retriever = library_retriever
        self.gate = gate
        self.projector = projector.to(small.device).eval() if projector is not None else None
        self.options = options or CascadeOptions()
        if self.options.soft_token and self.projector is None:
            raise ValueError("the soft-token prefix needs a trained projector")
        self.writer = SmallWriter(small, self.projector, TemplateDecoder(small))  # answers requests
        self._large_decoder: TemplateDecoder | None = None  # built on first use (vocabulary tables)
        self._small_prefixes = threading.local()  # PrefixCaches per thread: batched requests run side by side
        self.name = name
        self.shared_pass = shared_pass
        self.artifact: Path | None = None  # the directory it was loaded from, if any
        self._library: LibraryCache | None = None
        self._per_function: PerFunctionLibrary | None = None

    def enable_batching(self, on_run: Callable[[str, int], None]) -> bool:
        """Let concurrent requests' steps share engine calls (models/step_batcher.py): only when both
        models run on llama.cpp (its state per request, the prefix caches per thread); else False.
        `on_run(model name, sequences)` is told each call's size."""
        backends = [self.large, self.small] + ([self.after_results.backend] if self.after_results is not None else [])
        if not all(hasattr(b, "enable_batching") for b in backends):
            return False
        for backend in backends:
            backend.enable_batching(lambda n, name=backend.name: on_run(name, n))
        return True

    def share_large_pass(self, other: HyFuncMethod) -> None:
        """Let `other` (another artifact with the same large model) reuse this cascade's pass per request."""
        if other.large is not self.large:
            raise ValueError("only cascades on the same loaded large model can share its pass")
        other.shared_pass = self._shared_pass()

    def _shared_pass(self) -> SharedLargePass:
        if self.shared_pass is None:
            self.shared_pass = SharedLargePass()
        return self.shared_pass

    def variant(self, options: CascadeOptions, name: str) -> HyFuncMethod:
        """The same trained parts under other options (an ablation); both then share each
        request's large-model pass, so a side-by-side run pays for it once."""
        variant = HyFuncMethod(
            self.large, self.small, self.retriever, self.projector, options, name, self._shared_pass(), self.library_retriever,
            self.gate, self.next_step, self.after_results,
        )
        variant.artifact = self.artifact
        return variant

    @classmethod
    def load(
        cls, directory: str | Path, options: CascadeOptions | None = None, device: str | None = None,
        large: BackendBase | None = None, large_engine: str = "auto", small_engine: str = "auto",
    ) -> HyFuncMethod:
        """The cascade prepared in `directory`, its large and small models on the given engines;
        `large`: an already loaded large model to reuse (used only if it is the artifact's)."""
        directory = Path(directory)
        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            raise InputError(f"{directory}: no {MANIFEST}; not a prepared cascade (run `hyfunc prepare`)")
        manifest = json.loads(manifest_path.read_text())
        if large is None or large.name != manifest["large_model"] or large.engine != resolve_engine(large_engine, large.name, device, "large"):
            large = load_backend(manifest["large_model"], large_engine, device=device, role="large")
        adapter = directory / "adapter" if (directory / "adapter").is_dir() else None
        small = load_backend(manifest["small_model"], small_engine, device=device, adapter=adapter, role="small")
        projector = load_projector(directory) if (directory / "projector.json").is_file() else None
        retriever = Retriever.load(directory / "retriever")
        library_retriever = Retriever.load(directory / "library_retriever") if (directory / "library_retriever").is_dir() else None
        gate = OffTopicGate.load(directory / GATE_DIR) if (directory / GATE_DIR).is_dir() else None
        next_step = NextStepHead.load(directory / NEXT_STEP_DIR) if (directory / NEXT_STEP_DIR).is_dir() else None
        after_results = load_after_results(directory, manifest["small_model"], small_engine, device)
        method = cls(large, small, retriever, projector, options, name=f"hyfunc:{directory.name}",
                     library_retriever=library_retriever, gate=gate, next_step=next_step, after_results=after_results)
        method.artifact = directory
        method.writer.warm_up()
        return method

    @property
    def config(self) -> dict:
        """What defines this cascade's answers, for run records (the artifact's own manifest, with
        its training settings, is hashed into the records' provenance)."""
        return {
            "artifact": str(self.artifact) if self.artifact is not None else None,
            "large_model": self.large.name,
            "small_model": self.small.name,
            "engines": {"large": self.large.description, "small": self.small.description},
            "options": asdict(self.options),
            "retriever": asdict(self.retriever.config),
            "library_retriever": self.library_retriever is not None,
            "off_topic_gate": asdict(self.gate.config) if self.gate is not None else None,
            "next_step": self.next_step.config.threshold if self.next_step is not None else None,
            "after_results": self.after_results.backend.description if self.after_results is not None else None,
            "max_prompt_tools": self.MAX_PROMPT_TOOLS,
        }

    #: Libraries up to this many tools are read in one prompt (joint mode); larger ones per function.
    MAX_PROMPT_TOOLS = 128

    def library_mode(self, n_tools: int) -> str | None:
        """How a library of `n_tools` is read: "joint" (one prompt), "per_function" (needs the
        artifact's library retriever), or None when this cascade cannot read it."""
        if n_tools <= self.MAX_PROMPT_TOOLS:
            return "joint"
        return "per_function" if self.library_retriever is not None else None

    def library_state(self) -> LibraryState | None:
        """The library fixed by the last `use_library` (or `set_library_state`), None if none."""
        if self._library is not None:
            return LibraryState(list(self._library.tools), joint=self._library)
        if self._per_function is not None:
            return LibraryState(list(self._per_function.tools), per_function=self._per_function)
        return None

    def set_library_state(self, state: LibraryState | None) -> None:
        """Fix the library `state` (from `library_state`, on the same loaded models) without
        computing anything; None: no fixed library."""
        self._library = state.joint if state is not None else None
        self._per_function = state.per_function if state is not None else None

    def library_stored(self, tools: Sequence[Tool]) -> bool:
        """Whether `use_library(tools)` finds the per-function embeddings on disk (computes none)."""
        return self.library_mode(len(tools)) == "per_function" and embeddings_stored(self.encoder, tools)

    def library_embedding(self, tools: Sequence[Tool], disk_cache_bytes: int = DISK_CACHE_BYTES) -> LibraryEmbedding | None:
        """The per-function embeddings `use_library(tools)` would compute, to compute them a few
        tools at a time beforehand (the server does, between requests); None for a library read in
        one prompt or not at all."""
        if self.library_mode(len(tools)) != "per_function":
            return None
        return LibraryEmbedding(self.encoder, tools, disk_cache_bytes)

    def use_library(self, tools: Sequence[Tool], disk_cache_bytes: int = DISK_CACHE_BYTES) -> None:
        """Fix the tool library (the server case). Up to MAX_PROMPT_TOOLS tools, the KV cache of
        [instruction + tools] is computed once and each request runs only its own tokens. A larger
        library never fits a prompt: its tools are embedded one by one (cached on disk, in at most
        `disk_cache_bytes` for all libraries), each request gets a soft token over [instruction +
        request], and the artifact's library retriever (`hyfunc prepare --library`), with the
        request's lexical scores, picks the tools the small model sees."""
        tools = list(tools)
        self._library, self._per_function = None, None
        if self.gate is not None:
            self.gate.tool_vectors(tools)  # embedded once here, not in the first request
        if len(tools) <= self.MAX_PROMPT_TOOLS:
            self._library = self.encoder.build_library(tools)
            return
        if self.library_retriever is None:
            raise InputError(
                f"a library of {len(tools)} tools is read per function and needs a library retriever: "
                "prepare the cascade with `hyfunc prepare --library <tools.jsonl>`"
            )
        self._per_function = PerFunctionLibrary.build(self.encoder, tools, disk_cache_bytes)

    def _encode(
        self, messages: Sequence[dict], tools: Sequence[Tool], per_function: PerFunctionLibrary | None
    ) -> tuple[Encoding, bool, Retriever]:
        """The large model's pass for this request: (encoding, reused from a shared pass?, the
        retriever that matches how it was encoded)."""
        if per_function is not None:
            encoding = self.encoder.encode_request(messages)
            encoding.function_embeddings = per_function.embeddings
            return encoding, False, self.library_retriever
        library = self._held_library(tools)
        source = library if library is not None else tools
        if self.shared_pass is not None:
            encoding, reused = self.shared_pass.encode(self.encoder, messages, tools, source)
            return encoding, reused, self.retriever
        return self.encoder.encode(messages, source), False, self.retriever

    def _held_library(self, tools: Sequence[Tool]) -> LibraryCache | None:
        return self._library if self._library is not None and self._library.tools == list(tools) else None

    @torch.no_grad()
    def _alone_pass(self, alone: Sequence[dict], tools: Sequence[Tool]) -> Encoding:
        """The large model's pass over a follow-up's new message alone, after the tools."""
        library = self._held_library(tools)
        return self.encoder.encode(alone, library if library is not None else tools)

    def gate_text(self, messages: Sequence[dict]) -> str:
        """What the off-topic gate reads: a follow-up's new message (after an on-topic request, a
        transcript is never far from the tools), else the request."""
        alone = follow_up_alone(messages) if self.options.follow_up_alone else None
        return conversation_text(alone or messages)

    def _writer(self, messages: Sequence[dict]) -> SmallWriter:
        """The small model that writes this request's calls: the after-results one, if the cascade
        has it and the conversation ends with tool results."""
        if self.after_results is not None and ends_with_tool_results(messages):
            return self.after_results
        return self.writer

    def _small_prefill(self, small: BackendBase, prompt: SmallPrompt, embeds: torch.Tensor) -> tuple[StepOutput, int]:
        """The small model's pass over its prompt. The token ids before the soft token go through
        a prefix cache (one per thread and model): what they share with the previous request's
        there (the instruction always, the tools too when the same ones were retrieved) is not run
        again (exact); the soft token and the rest follow as embeddings."""
        caches = self._small_prefixes.__dict__.setdefault("caches", {})
        prefix = caches.get(id(small))
        if prefix is None:
            prefix = caches[id(small)] = PrefixCache(small)
        step, reused = prefix.run(prompt.before_ids)
        rest = embeds[len(prompt.before_ids):]
        return (small.forward(embeds=rest, cache=step.cache) if len(rest) else step), reused

    def _large_writes(
        self, answer: Answer, state: StepOutput, selected: list[Tool], request: str, on_text: Callable[[str], None] | None
    ) -> Answer:
        """The call list written by the large model from its own pass (`CascadeOptions.small_model`
        off), on a fork of that pass's state."""
        start = time.perf_counter()
        if self._large_decoder is None:
            self._large_decoder = TemplateDecoder(self.large)
        step = StepOutput(state.logits, None, self.large.fork(state.cache))
        out = self._large_decoder.decode(step, selected, require_call=self.options.retriever, draft_source=request,
                                         on_text=on_text, alternatives=self.options.alternatives)
        answer.timings["large_decode"] = time.perf_counter() - start
        return _with_decoded(answer, out, "large_forward_passes")

    def answer(
        self, messages: Sequence[dict], tools: Sequence[Tool], on_text: Callable[[str], None] | None = None
    ) -> Answer:
        """`on_text` (optional): receives the call list as JSON text in pieces, each as soon as
        the templating decoder has written it for good (see `methods.base.calls_text`)."""
        timings: dict[str, float] = {}
        request = _request_text(messages)
        gate = self.gate if self.options.off_topic_gate else None
        start = time.perf_counter()
        screened = gate.screen(self.gate_text(messages), tools) if gate is not None else "clear"
        timings["gate"] = time.perf_counter() - start
        if screened == "dismissed":  # far from every tool: no large-model pass
            if on_text is not None:
                on_text(calls_text([]))
            return Answer(calls=[], timings=timings, details={"refused_by": "off_topic_gate", "dismissed": True})
        suspected = screened == "suspected"
        per_function = self._per_function if self._per_function is not None and self._per_function.tools == list(tools) else None
        encoding, reused, retriever = self._encode(messages, tools, per_function)
        next_step: dict = {}
        if self.next_step is not None and per_function is None and ends_with_tool_results(messages):
            p_answer = float(self.next_step.p_answer(encoding.soft_token))
            done = p_answer >= self.next_step.config.threshold
            next_step = {"next_step": "answer" if done else "call", "p_answer": round(p_answer, 4)}
            if done:  # the request is done: a text answer, no call
                if on_text is not None:
                    on_text(calls_text([]))
                timings["large_prefill"] = encoding.seconds
                return Answer(calls=[], input_tokens=encoding.input_tokens, cached_tokens=encoding.cached_tokens,
                              timings=timings, reused_seconds=encoding.seconds if reused else 0.0, details=next_step)
        start = time.perf_counter()
        if per_function is not None:
            scored = per_function.score(self.encoder, retriever, request, encoding.soft_token)
            encoding.seconds += scored.timings["sentences"]  # the per-sentence pass is the large model's
            start += scored.timings["sentences"]
            cosine, scores = scored.cosine, scored.fused
        else:
            # A short list is indexed in under a millisecond.
            lexical = lexical_scores(request, tools) if retriever.config.lexical_weight and len(tools) else None
            with torch.no_grad():
                cosine = retriever.scores(encoding.soft_token, encoding.function_embeddings) if len(tools) else torch.empty(0)
            scores = retriever.fuse(cosine, lexical)
        timings["large_prefill"] = encoding.seconds
        alone = follow_up_alone(messages) if self.options.follow_up_alone else None
        alone_pass = self._alone_pass(alone, tools) if alone is not None and per_function is None and len(tools) else None
        if alone_pass is not None:
            timings["follow_up_prefill"] = alone_pass.seconds
        confirming = alone_pass if alone_pass is not None and self.options.gate_confirms_alone else encoding
        if suspected and gate.confirms(confirming.soft_token):
            if on_text is not None:
                on_text(calls_text([]))
            return Answer(calls=[], input_tokens=encoding.input_tokens, cached_tokens=encoding.cached_tokens,
                          timings=timings, reused_seconds=encoding.seconds if reused else 0.0,
                          details={"refused_by": "off_topic_gate"})
        answerable = float(retriever.answerability(encoding.soft_token, [cosine]))  # "no tool fits" below its threshold
        # After tool results the head has decided that a call is due: the retriever only picks the
        # tools (its refusal head learned first requests, not conversations).
        if next_step:
            answerable = math.inf
        follow_up: dict = {}
        if alone_pass is not None:
            follow_up = {"answerability_conversation": round(answerable, 4)}
            with torch.no_grad():
                alone_cosine = retriever.scores(alone_pass.soft_token, alone_pass.function_embeddings)
                answerable = float(retriever.answerability(alone_pass.soft_token, [alone_cosine]))
        chosen = retriever.select_from_scores(scores, answerable) if len(tools) else []
        selected = [tools[i] for i in chosen] if self.options.retriever else list(tools)
        timings["retrieve"] = time.perf_counter() - start - timings.get("follow_up_prefill", 0.0)
        # The best RANKING_SHOWN only: a per-function library has thousands of tools.
        ranking = torch.argsort(scores, descending=True, stable=True)[:RANKING_SHOWN].tolist()
        answer = Answer(
            calls=[], input_tokens=encoding.input_tokens, cached_tokens=encoding.cached_tokens, timings=timings,
            reused_seconds=encoding.seconds if reused else 0.0,
            details={
                "answerability": round(answerable, 4),  # refused below the retriever's refusal threshold
                "ranking": [tools[i].name for i in ranking],
                "scores": [round(float(scores[i]), 4) for i in ranking],
                "retrieved": [tools[i].name for i in chosen],
                **next_step,
                **follow_up,
            },
        )
        if not selected:
            if on_text is not None:
                on_text(calls_text([]))
            return answer  # no tool fits: the small model is not run

        if not self.options.small_model and self.options.templating and encoding.state is not None:
            return self._large_writes(answer, encoding.state, selected, request, on_text)
        start = time.perf_counter()
        writer = self._writer(messages)
        small = writer.backend
        if writer is self.after_results:
            answer.details["small_model"] = "after_results"
        soft = encoding.soft_token if self.options.soft_token else None
        prompt = build_small_prompt(small, request, selected, with_soft_token=soft is not None)
        with torch.inference_mode():
            embeds = prompt_embeds(small, writer.projector, prompt, soft)
        answer.input_tokens += len(prompt)
        if self.options.templating:
            step, reused = self._small_prefill(small, prompt, embeds)
            answer.cached_tokens += reused
            timings["small_prefill"] = time.perf_counter() - start
            start = time.perf_counter()
            values = None
            kinds = self.options.large_value_kinds()
            if kinds and encoding.state is not None:
                drafts = self.options.value_drafts
                values = LargeValueWriter(self.large, encoding.state, kinds=kinds,
                                          draft_source=request if drafts else "", model_drafts=drafts,
                                          request=request, described_forms=self.options.described_forms)
            # "No tool fits" is the retriever's decision: once it has selected tools, the small
            # model writes at least one call (left to choose, it refused far too often).
            out = writer.decoder.decode(
                step, selected, require_call=self.options.retriever, draft_source=request, on_text=on_text,
                write_value=values, alternatives=self.options.alternatives,
            )
            timings["small_decode"] = time.perf_counter() - start
            if values is not None:
                timings["small_decode"] -= values.seconds
                timings["large_values"] = values.seconds
                answer.details["large_values"] = {"values": values.values, "tokens": values.tokens,
                                                  "passes": values.passes, "drafted": values.drafted}
            return _with_decoded(answer, out, "small_forward_passes")
        # Ablation: the small model writes the whole call text itself.
        gen = small.generate(embeds=embeds, max_new_tokens=256)
        timings["small_prefill"], timings["small_decode"] = gen.prefill_seconds, gen.decode_seconds
        answer.raw_text, answer.output_tokens = gen.text, len(gen.token_ids)
        try:
            answer.calls = parse_calls(gen.text)
        except CallParseError as err:
            answer.error = str(err)
        if on_text is not None:
            on_text(calls_text(answer.calls))
        return answer
