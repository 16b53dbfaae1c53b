"""The small model and the next-step head trained on agent conversations, starting from a prepared
cascade (`hyfunc prepare --agent-only`).

Single-turn training shows the small model a request alone. In an agent loop it reads the
conversation as `conversation_text` renders it (the request, then the calls made and their
results) and must write only the calls still due, with values a result may have given. Items:

- "call" steps of `agent_steps` (the first k of n calls made) -> the calls left;
- chained requests (`chained_steps`): before any call -> the first request's calls only (the
  second one's value is not known yet); after their results -> the second call, its value
  copied from a result;
- independent requests asked at once (`joined_openings`): before any call -> every call of both,
  so that "Then" alone does not teach the model to stop after the first request's calls;
- a replay sample of single-turn items, so the first request's answers are not forgotten.

The adapter and the projector go on training from the cascade's own (a warm start), on the
training split only, and replace them; or, with `separate` (steps after results only), they
become the cascade's after-results small model (after_results.py) and its own stay as they were.
The next-step head is retrained with the chained conversations beside the others
(leave-one-source-out threshold, as `next_step_training`). Every large-model pass is
cached per conversation (`next_step_training.encode_steps`) or per example (`compute_embeddings`).
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from hyfunc.cascade.after_results import AFTER_RESULTS_DIR
from hyfunc.cascade.agent_steps import CALL, STEP_KINDS, AgentStep, agent_steps, chained_steps, joined_openings
from hyfunc.cascade.data import Example, load_examples, sample_by_pattern, split_examples
from hyfunc.cascade.manifest import MANIFEST, write_manifest
from hyfunc.cascade.next_step import NEXT_STEP_DIR
from hyfunc.cascade.next_step_training import cache_file, encode_steps, train_next_step
from hyfunc.cascade.prepare import SFTItem, compute_embeddings, load_embeddings, sft_items, train_small
from hyfunc.cascade.retriever import Retriever
from hyfunc.cascade.small_model import build_small_prompt
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.cascade.templating import TemplateDecoder, TemplateError, target_token_mask
from hyfunc.formats.calls import Call
from hyfunc.formats.messages import conversation_text
from hyfunc.models.backend import Backend
from hyfunc.models.base import BackendBase
from hyfunc.models.engines import load_backend


@dataclass
class AgentTrainingConfig:
    per_source: int = 30  # agent_steps' conversations of each label per source (the head's, as prepared)
    chained_per_source: int = 15  # chained requests per source (three steps each)
    joined_per_source: int = 15  # independent requests asked at once per source (their opening)
    max_items: int = 240  # agent items sampled (equal shares of the kinds below)
    kinds: tuple[str, ...] = STEP_KINDS  # of the small model's items
    # True: the trained adapter and projector become the artifact's after-results small model
    # (after_results.py) and its own stay as they were; then `kinds` must be ("after_results",).
    separate: bool = False
    replay: int = 80  # single-turn items sampled from the training split
    sft_epochs: int = 1
    sft_lr: float = 1e-4  # half the first training's: it goes on from a trained adapter
    sft_grad_accum: int = 8
    sft_gradient_checkpointing: bool = False
    lora_rank: int = 16  # the adapter's (read from it; kept for train_small's config)
    seed: int = 0


def sft_steps(examples: Sequence[Example], train_ids: set[str], config: AgentTrainingConfig) -> list[AgentStep]:
    """The conversations the small model learns from: those whose next step is a call, built only
    from training examples. They are built from all `examples` as the next-step head's are, so
    the two share their large-model passes."""
    steps = agent_steps(examples, config.per_source, config.seed)
    steps += chained_steps(examples, config.chained_per_source, config.seed)
    steps += joined_openings(examples, config.joined_per_source, config.seed)
    return [s for s in steps if s.label == CALL and set(s.origin) <= train_ids and s.kind in config.kinds]


def agent_sft_items(
    steps: Sequence[AgentStep], soft_tokens: torch.Tensor, small: BackendBase, decoder: TemplateDecoder
) -> tuple[list[SFTItem], int]:
    """One item per conversation: its transcript as the request, all its tools offered (an agent's
    few), the calls left as the target."""
    items, skipped = [], 0
    for step, soft in zip(steps, soft_tokens):
        calls = [Call(c["name"], dict(c.get("arguments") or {})) for c in step.remaining]
        try:
            ids, mask = target_token_mask(small, calls, step.tools, decoder)
        except TemplateError:
            skipped += 1
            continue
        prompt = build_small_prompt(small, conversation_text(step.messages), step.tools)
        items.append(SFTItem(prompt, soft, ids, mask, step.kind))
    return items, skipped


def train_agent_steps(artifact: Path, data: Sequence[str], engine: str, cache_dir: Path, config: AgentTrainingConfig,
                      large: BackendBase | None = None, small: Backend | None = None) -> dict:
    """Go on training the cascade in `artifact` on agent conversations from `data`; returns the
    record also written into its manifest (`metrics.agent_sft`, `metrics.next_step`). Backends
    may be passed in (tests)."""
    if config.separate and tuple(config.kinds) != ("after_results",):
        raise ValueError("an after-results small model learns only the steps after results (kinds: after_results)")
    manifest = json.loads((artifact / MANIFEST).read_text())
    everything = load_examples(list(data))
    train, _ = split_examples(everything, manifest["config"].get("val_fraction", 0.1))
    large = large or load_backend(manifest["large_model"], engine, role="large")
    encoder = SoftTokenEncoder(large)
    cache = cache_file(cache_dir, large)
    started = time.perf_counter()

    steps = sft_steps(everything, {ex.id for ex in train}, config)
    steps = sample_by_pattern(steps, config.max_items, config.seed, pattern=lambda s: s.kind)
    soft = encode_steps(encoder, steps, cache)
    # fp32 on transformers: the small model is trained here.
    small = small or Backend(manifest["small_model"], dtype=torch.float32)
    decoder = TemplateDecoder(small)
    items, skipped = agent_sft_items(steps, soft, small, decoder)
    counts = {kind: sum(i.pattern == kind for i in items) for kind in config.kinds}

    replay_examples = sample_by_pattern([ex for ex in train if ex.answers], config.replay, config.seed)
    embeddings_dir = cache.with_suffix("") / "single-turn"
    compute_embeddings(encoder, replay_examples, embeddings_dir, 64)
    embeddings = load_embeddings(embeddings_dir, {ex.id for ex in replay_examples})
    replay, replay_skipped = sft_items(replay_examples, embeddings, Retriever.load(artifact / "retriever"), small, decoder)
    encode_seconds = time.perf_counter() - started

    work = artifact / "agent_sft"
    if not (work / "sft" / "state.json").is_file():  # a fresh warm start (else: resume it)
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(artifact / "adapter", work / "sft" / "adapter")
        shutil.copy2(artifact / "projector.safetensors", work / "sft" / "projector.safetensors")
    start = time.perf_counter()
    _, sft = train_small(work, small, large.hidden_size, items + replay, config)
    sft_seconds = time.perf_counter() - start
    into = artifact / AFTER_RESULTS_DIR if config.separate else artifact
    shutil.rmtree(into / "adapter", ignore_errors=True)
    shutil.copytree(work / "adapter", into / "adapter")
    shutil.copy2(work / "projector.safetensors", into / "projector.safetensors")
    if config.separate:  # the projector's shapes are the cascade's (a warm start)
        shutil.copy2(artifact / "projector.json", into / "projector.json")
    shutil.rmtree(work)

    trained = train_next_step(artifact / NEXT_STEP_DIR, large, everything, config.per_source, cache_dir, config.seed,
                              chained_per_source=config.chained_per_source)
    head = {k: trained[k] for k in ("conversations", "threshold", "held_out")}
    record = {
        "config": asdict(config),
        "data": [str(d) for d in data],
        "engine": large.description,
        "items": {**counts, "single_turn_replay": len(replay), "skipped": skipped + replay_skipped},
        "epoch_losses": sft["epoch_losses"],
        "seconds": {"large_passes": round(encode_seconds, 1), "sft": round(sft_seconds, 1)},
    }
    manifest.setdefault("metrics", {})["agent_sft"] = record
    manifest["metrics"]["next_step"] = head
    write_manifest(artifact, manifest)
    return {**record, "next_step": head}
