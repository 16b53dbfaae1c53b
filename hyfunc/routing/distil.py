"""Distillation: fine-tune the small model on the large path's logged answers (teacher labels,
never gold) plus a replay sample of fc-train, with the cascade's own SFT code.

Items are built as the small path will be prompted: the selector's tools for the request (plus
any tool the teacher called that it missed, so the target is always writable, as `hyfunc
prepare` does with its retriever), the cascade's small prompt without the soft-token slot, and
the teacher's calls as the target, with the loss only on the tokens the templating decoder lets
the model choose (`target_token_mask`). Requests the teacher refused are left out: "no tool
fits" is the selector's decision on the small path. Requests with `bad` feedback are left out.

Training is `hyfunc.cascade.prepare.train_small` without a projector: a LoRA adapter, warm
started from the current small model's adapter (the champion's, or the cascade's), resumable.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import random
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from hyfunc.cascade.data import (
    Example,
    call_pattern,
    load_examples,
    sample_by_pattern,
    split_examples,
)
from hyfunc.cascade.prepare import PrepareConfig, SFTItem, train_small
from hyfunc.cascade.selector import ToolSelector
from hyfunc.cascade.small_model import build_small_prompt
from hyfunc.cascade.templating import TemplateDecoder, TemplateError, target_token_mask
from hyfunc.errors import InputError
from hyfunc.formats.calls import calls_from_records
from hyfunc.formats.messages import conversation_text
from hyfunc.formats.schema import SchemaError, parse_tools
from hyfunc.models.backend import Backend
from hyfunc.routing.store import LARGE_PATHS, Query, StoredRequest, TrafficStore


@dataclass
class DistilConfig:
    epochs: int = 1
    lora_rank: int = 16  # of a new adapter; a warm start keeps its own
    lr: float = 2e-4
    grad_accum: int = 8
    replay_fraction: float = 0.5  # fc-train items added per teacher item (so it does not forget)
    max_items: int | None = None  # cap on teacher items (a sample balanced by call pattern)
    seed: int = 0
    in_child_process: bool = True  # train in a spawned process, so its memory goes back to the OS
    gradient_checkpointing: bool = True  # about half the peak memory on long prompts, ~16 % slower


def teacher_example(stored: StoredRequest) -> Example | None:
    """A logged large-path answer as a training example (None: unusable or refused)."""
    req = stored.request
    if stored.feedback == "bad" or req.error is not None or not req.calls or req.path not in LARGE_PATHS:
        return None
    query = conversation_text(req.messages)
    try:
        tools = parse_tools(req.tools)
    except SchemaError:
        return None
    if not query or not tools:
        return None
    return Example(req.request_id, "traffic", query, tools, calls_from_records(req.calls))


def teacher_examples(store: TrafficStore, query: Query) -> list[Example]:
    selection = Query(query.since, query.until, LARGE_PATHS if query.paths is None else query.paths,
                      query.library, True, False, query.limit)
    return [ex for ex in map(teacher_example, store.iter_requests(selection)) if ex is not None]


def replay_examples(data: Sequence[str], n: int, seed: int) -> list[Example]:
    """n examples with calls from fc-train's *train* split (the validation split stays held out)."""
    if n <= 0 or not data:
        return []
    train, _ = split_examples(load_examples(list(data)))
    callers = [ex for ex in train if ex.answers]
    return sample_by_pattern(callers, n, seed) if n < len(callers) else callers


def labelled_examples(data: Sequence[str], n: int, seed: int = 0) -> list[Example]:
    """n call requests from fc-train's *validation* split with their gold calls, sampled by call
    pattern as `scripts/fc_validation.py` samples (the same seed gives the same requests): the
    gate's fixed labelled set for the small path."""
    if n <= 0 or not data:
        return []
    _, val = split_examples(load_examples(list(data)))
    callers = [ex for ex in val if ex.answers and ex.tools]
    return sample_by_pattern(callers, n, seed) if n < len(callers) else callers


def narrowed(examples: Sequence[Example], selector: ToolSelector) -> list[Example]:
    """Each example with the tools the small path will read: the selector's, plus any tool the
    answer calls that it missed (so the target is always writable)."""
    out = []
    for ex in examples:
        gold = {c.name for c in ex.answers}
        selected = set(selector.select(ex.query, ex.tools))
        tools = [t for i, t in enumerate(ex.tools) if i in selected or t.name in gold]
        out.append(dataclasses.replace(ex, tools=tools))
    return out


def distil_items(examples: Sequence[Example], small: Backend) -> tuple[list[SFTItem], int]:
    """(items, examples skipped because the templates cannot write their calls); `examples` are
    already `narrowed`."""
    decoder = TemplateDecoder(small)
    items: list[SFTItem] = []
    skipped = 0
    for ex in examples:
        try:
            ids, mask = target_token_mask(small, ex.answers, ex.tools, decoder)
        except TemplateError:
            skipped += 1
            continue
        prompt = build_small_prompt(small, ex.query, ex.tools, with_soft_token=False)
        items.append(SFTItem(prompt, None, ids, mask, call_pattern(ex)))
    return items, skipped


def distil(base_model: str, warm_adapter: Path | None, teacher: Sequence[Example], replay: Sequence[Example],
           selector: ToolSelector, out: Path, config: DistilConfig) -> dict:
    """Train a LoRA adapter of `base_model` into `out/adapter`; returns what was trained on.
    A rerun with the same `out` resumes (train_small's per-epoch checkpoint).

    Training runs in a child process (`config.in_child_process`): a long-lived server or
    benchmark gets the fp32 model's and the optimizer's memory back when it exits (in-process,
    a 0.5B SFT left the benchmark process ~1.5x slower for the rest of its life:
    reports/odia-library). Tool selection happens here, where the selector's tool vectors are cached."""
    started = time.perf_counter()
    teacher = list(teacher)
    if config.max_items and len(teacher) > config.max_items:
        teacher = sample_by_pattern(teacher, config.max_items, config.seed)
    n_replay = min(len(replay), int(round(config.replay_fraction * len(teacher))))
    replayed = random.Random(config.seed).sample(list(replay), n_replay)
    args = (base_model, warm_adapter, narrowed(teacher, selector), narrowed(replayed, selector), out, config)
    if config.in_child_process:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            trained = pool.submit(_train, *args).result()
    else:
        trained = _train(*args)
    return {**trained, "warm_start": str(warm_adapter) if warm_adapter else None, "seconds": time.perf_counter() - started}


def _train(base_model: str, warm_adapter: Path | None, teacher: list[Example], replay: list[Example], out: Path,
           config: DistilConfig) -> dict:
    small = Backend(base_model, dtype=torch.float32)  # trained in fp32, as `hyfunc prepare` does
    items, skipped = distil_items(teacher, small)
    replay_items, replay_skipped = distil_items(replay, small)
    if not items:
        raise InputError(f"no teacher answer to distil ({len(teacher)} examples, {skipped} not writable)")
    if warm_adapter is not None and not (out / "sft" / "state.json").is_file():
        shutil.rmtree(out / "sft" / "adapter", ignore_errors=True)
        shutil.copytree(warm_adapter, out / "sft" / "adapter")  # train_small continues from it
    prepare_config = PrepareConfig(large_model="", small_model=base_model, data=[], sft_epochs=config.epochs,
                                   sft_lr=config.lr, sft_grad_accum=config.grad_accum, lora_rank=config.lora_rank,
                                   sft_gradient_checkpointing=config.gradient_checkpointing, seed=config.seed)
    _, metrics = train_small(out, small, None, items + replay_items, prepare_config)
    return {"teacher_items": len(items), "teacher_skipped": skipped, "replay_items": len(replay_items),
            "replay_skipped": replay_skipped, "epoch_losses": metrics["epoch_losses"]}
