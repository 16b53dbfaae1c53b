"""Offline preparation of a cascade (`hyfunc prepare`): embeddings -> retriever -> small-model SFT.

Every stage writes its result into the artifact directory and is skipped when that result is
already there, so an interrupted run resumes where it stopped:

    embeddings/NNNNN.safetensors   large-model soft tokens + function embeddings, shards of
                                   `shard_size` examples keyed by example id (written whole or not at all)
    retriever/                     trained + calibrated retriever, cosine fused with lexical scores
                                   (manifest written last)
    library_retriever/, library-requests/   with --library: a retriever for that library in
                                   per-function mode, and its cached request soft tokens
    sft/                           small-model checkpoint (projector, LoRA adapter, step), per epoch
    projector.*, adapter/          the final small-model parts
    retriever/ (again)             its keep threshold re-chosen end to end: by the trained small model's
                                   calls on the validation split (metrics["end_to_end"] marks it done)
    manifest.json                  models, data hash, hyper-parameters, metrics (written last)

Training data never include BFCL: they come from the given JSON Lines files (fc-train).
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from hyfunc.cascade.data import (
    Example,
    augment_refusals,
    call_pattern,
    load_examples,
    repeated_examples,
    sample_by_pattern,
    split_examples,
)
from hyfunc.cascade.lexical import fit_lexical_weight, lexical_scores
from hyfunc.cascade.library import train_library_retriever
from hyfunc.cascade.manifest import MANIFEST, write_manifest
from hyfunc.cascade.next_step import NEXT_STEP_DIR, OneKindOnly
from hyfunc.cascade.next_step_training import train_next_step
from hyfunc.cascade.off_topic import GATE_DIR, OffTopicGate, train_gate
from hyfunc.cascade.retriever import (
    RetrievalData,
    Retriever,
    calibrate,
    evaluate,
    example_scores,
    new_retriever,
    plateau_middle,
    threshold_grid,
    train_retriever,
)
from hyfunc.cascade.schema_variants import schema_variants
from hyfunc.cascade.shards import fill_shards, read_shards
from hyfunc.cascade.small_model import (
    SmallPrompt,
    SoftTokenProjector,
    build_small_prompt,
    prompt_embeds,
    save_projector,
    soft_prefix_loss,
)
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.cascade.templating import TemplateDecoder, TemplateError, target_token_mask
from hyfunc.errors import InputError
from hyfunc.formats.calls import same_calls
from hyfunc.models.backend import Backend, default_dtype


log = logging.getLogger("hyfunc.prepare")


@dataclass
class PrepareConfig:
    large_model: str
    small_model: str
    data: list[str]
    val_fraction: float = 0.1
    refusal_fraction: float = 0.15  # extra no-call examples of each kind (near miss, unrelated tools, off-topic)
    off_topic_gate: bool = True  # train the off-topic gate (off_topic.py) on the large model's soft tokens
    # Agent conversations of each kind per source for the next-step head (next_step.py); 0: none.
    next_step_per_source: int = 30
    repeat_fraction: float = 0.0  # extra repeated-call examples (data.repeated_examples), from the whole split
    schema_fraction: float = 0.0  # extra training requests under other spellings of their schemas (schema_variants.py)
    shard_size: int = 64
    retriever: dict = field(default_factory=lambda: {"proj_dim": 256, "mlp_hidden": 0, "epochs": 30, "lr": 1e-3, "refusal_head": True})
    sft_epochs: int = 1
    sft_lr: float = 2e-4
    sft_grad_accum: int = 8
    # Recompute activations in the backward pass: LoRA back-propagates through every layer, and a
    # long prompt's fp32 activations took 11.3 GB against 5.4 GB with it, for 16 % more time
    # (reports/odia-library-side-by-side). On for distillation, which runs beside a serving process.
    sft_gradient_checkpointing: bool = False
    lora_rank: int = 16  # 0: train the projector only
    sft_max_items: int | None = None  # a sample of the SFT items, balanced by call pattern (time is linear in it)
    max_examples: int | None = None  # a sample of the data, balanced by call pattern (embedding time is linear in it)
    library: str | None = None  # a large tool library (JSON Lines): also train a retriever for it, per-function mode
    seed: int = 0


def data_hash(paths: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for item in map(Path, paths) for p in ([item] if item.is_file() else sorted(item.glob("*.jsonl")))):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# stage 1: large-model embeddings


def compute_embeddings(encoder: SoftTokenEncoder, examples: list[Example], directory: Path, shard_size: int) -> None:
    """Embed every example not yet cached in `directory` (id-keyed shards, see shards.py)."""
    by_id = {ex.id: ex for ex in examples}

    def compute(ids: list[str], tick) -> dict[str, torch.Tensor]:
        soft, functions = [], []
        for ex_id in ids:
            encoding = encoder.encode(by_id[ex_id].query, by_id[ex_id].tools)
            soft.append(encoding.soft_token)
            functions.append(encoding.function_embeddings)
            tick()
        return {"soft_tokens": torch.stack(soft), "functions": torch.cat(functions),
                "counts": torch.tensor([len(f) for f in functions])}

    fill_shards(directory, list(by_id), compute, shard_size, "large-model embeddings")


def load_embeddings(directory: Path, ids: set[str] | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """id -> (soft token (H,), function embeddings (n_tools, H)), for `ids` (default: all)."""
    out = {}
    for held, tensors in read_shards(directory, ids):
        functions = torch.split(tensors["functions"], tensors["counts"].tolist())
        for row, ex_id in enumerate(held):
            if ids is None or ex_id in ids:
                out[ex_id] = (tensors["soft_tokens"][row], functions[row])
    return out


def retrieval_data(
    examples: list[Example], embeddings: dict[str, tuple[torch.Tensor, torch.Tensor]], lexical: bool = True
) -> RetrievalData:
    """`lexical`: with each request's lexical scores of its tools (training does not use them)."""
    queries, functions, candidates, positives, keys, scores = [], [], [], [], [], []
    for ex in examples:
        start = len(keys)
        soft, function_embeddings = embeddings[ex.id]
        functions.append(function_embeddings)
        candidates.append(list(range(start, start + len(ex.tools))))
        gold = {c.name for c in ex.answers}
        positives.append([start + i for i, t in enumerate(ex.tools) if t.name in gold])
        keys += [json.dumps(t.to_json_schema(), sort_keys=True) for t in ex.tools]
        queries.append(soft)
        if lexical:
            scores.append(lexical_scores(ex.query, ex.tools))
    return RetrievalData(torch.stack(queries), torch.cat(functions), candidates, positives, keys, scores if lexical else None)


# ---------------------------------------------------------------------------------------------
# stage 2: retriever


def prepare_retriever(
    directory: Path, train: RetrievalData, val: RetrievalData, hidden: int, options: dict, seed: int
) -> tuple[Retriever, dict]:
    if (directory / MANIFEST).is_file():
        retriever = Retriever.load(directory)
        return retriever, retriever.meta.get("metrics", {})
    retriever, training = new_retriever(hidden, options, seed)
    history = train_retriever(retriever, train, seed=seed, **training)
    # The weight is fitted on the validation split, like the thresholds, rather than on training
    # examples held out of the projections: trained on 85 % of the examples, the projections gave
    # lower cosines on BFCL's requests (with refusal then a threshold on the cosine, it refused nearly all).
    # Lists are short: the weight that best ranks each example's gold tools into its top |gold|.
    lexical_fit = fit_lexical_weight(retriever, val, k=None)
    calibration = calibrate(retriever, val)
    metrics = {"loss_history": history, "lexical_fit": lexical_fit, "calibration": calibration, "validation": evaluate(retriever, val)}
    retriever.save(directory, meta={"metrics": metrics})
    return retriever, metrics


# ---------------------------------------------------------------------------------------------
# stage 3: small model (projector + LoRA) on soft-token-prefixed prompts


@dataclass
class SFTItem:
    prompt: SmallPrompt
    soft_token: torch.Tensor | None  # None: a prompt without the soft-token slot (the small path)
    target_ids: list[int]
    loss_mask: list[bool]
    pattern: str  # call_pattern of the example, for balanced sampling


def sft_items(
    examples: list[Example], embeddings, retriever: Retriever, small: Backend, decoder: TemplateDecoder
) -> tuple[list[SFTItem], int]:
    """One item per example whose gold calls the templates can express. The prompt shows what the
    retriever selects plus any gold tool it missed, so training sees realistic distractors and a
    full answer."""
    items, skipped = [], 0
    for ex in examples:
        soft, function_embeddings = embeddings[ex.id]
        selected = set(retriever.select(soft, function_embeddings)) if len(ex.tools) else set()
        gold = {c.name for c in ex.answers}
        tools = [t for i, t in enumerate(ex.tools) if i in selected or t.name in gold]
        try:
            ids, mask = target_token_mask(small, ex.answers, tools, decoder)
        except TemplateError:
            skipped += 1  # gold calls the schema cannot express (e.g. a value of the wrong type)
            continue
        items.append(SFTItem(build_small_prompt(small, ex.query, tools), soft, ids, mask, call_pattern(ex)))
    return items, skipped


def train_small(
    directory: Path, small: Backend, large_hidden: int | None, items: list[SFTItem], config: PrepareConfig
) -> tuple[SoftTokenProjector | None, dict]:
    """Projector + LoRA adapter, trained together; a checkpoint per epoch lets a run resume.
    `large_hidden` None: no soft token, the adapter alone (the small path's distillation,
    hyfunc.routing.distil; its items have no soft token). An adapter (and a projector) already
    in `sft/` before the first epoch is where training starts (a warm start)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(config.seed)
    checkpoint = directory / "sft"
    projector = None if large_hidden is None else SoftTokenProjector(large_hidden, small.model.get_input_embeddings().embedding_dim)
    if projector is None and not config.lora_rank:
        raise ValueError("without a soft token only the LoRA adapter is trained: lora_rank must be > 0")
    state = json.loads((checkpoint / "state.json").read_text()) if (checkpoint / "state.json").is_file() else {"epoch": 0, "losses": []}
    if projector is not None and (checkpoint / "projector.safetensors").is_file():
        projector.load_state_dict(load_file(str(checkpoint / "projector.safetensors")))
    if config.sft_gradient_checkpointing:
        small.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.lora_rank:
        if (checkpoint / "adapter").is_dir():
            small.model = PeftModel.from_pretrained(small.model, checkpoint / "adapter", is_trainable=True)
        else:
            lora = LoraConfig(r=config.lora_rank, lora_alpha=2 * config.lora_rank, lora_dropout=0.05,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
            small.model = get_peft_model(small.model, lora)
    else:
        small.model.requires_grad_(False)
    params = (list(projector.parameters()) if projector is not None else []) + [p for p in small.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.sft_lr)
    small.model.train()
    # bf16 matmuls where the hardware has them (weights and optimizer state stay fp32): ~3x faster
    # on CPUs with AMX, the same numerics class as fp32 training for LoRA.
    autocast = torch.autocast(small.device.type, dtype=torch.bfloat16, enabled=default_dtype(small.device) == torch.bfloat16)
    for epoch in range(state["epoch"], config.sft_epochs):
        order = list(range(len(items)))
        random.Random(config.seed + epoch).shuffle(order)
        running = []
        for step, index in enumerate(tqdm(order, desc=f"small-model SFT epoch {epoch + 1}", unit="ex")):
            item = items[index]
            with autocast:
                loss = soft_prefix_loss(small, projector, item.prompt, item.soft_token, item.target_ids, item.loss_mask)
            loss = loss / config.sft_grad_accum
            loss.backward()
            running.append(loss.item() * config.sft_grad_accum)
            if (step + 1) % config.sft_grad_accum == 0 or step + 1 == len(order):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        state["losses"].append(sum(running) / max(len(running), 1))
        state["epoch"] = epoch + 1
        if projector is not None:
            save_projector(projector, checkpoint)
        if config.lora_rank:
            small.model.save_pretrained(checkpoint / "adapter")
        (checkpoint / "state.json").write_text(json.dumps(state))
    small.model.eval()
    if projector is not None:
        projector.eval()
        save_projector(projector, directory)
    if config.lora_rank:
        small.model.save_pretrained(directory / "adapter")
    return projector, {"epoch_losses": state["losses"], "items": len(items)}


# ---------------------------------------------------------------------------------------------
# stage 4: the keep threshold, end to end


def calibrate_keep_threshold(
    retriever: Retriever, val: list[Example], embeddings, small: Backend, projector: SoftTokenProjector,
    grid_size: int = 201,
) -> dict:
    """Re-choose the retriever's keep threshold by what the selection is for: the small model's calls.

    Stage 2 chose it for the exact tool set, which counts a dropped gold tool and an extra one
    alike; in the cascade a dropped tool can never be called, while the small model often leaves an
    extra one alone (on BFCL, requests for two tools lost the second one to a score a little under
    that threshold). Over stage 2's grid, count the validation requests with calls whose calls the
    cascade writes exactly as the gold answer (names and arguments, in any order), and take the
    middle of the best plateau. A selection is a prefix of the request's ranking, so each request
    costs at most top_k decodes, whatever the grid. Sets `retriever.config.threshold`."""
    callers = [ex for ex in val if ex.answers and ex.tools]
    if not callers:
        return {"threshold": retriever.config.threshold, "requests": 0}
    scores = example_scores(retriever, retrieval_data(callers, embeddings))
    grid = threshold_grid(torch.cat(scores).numpy(), grid_size)
    top_k = retriever.config.top_k
    decoder = TemplateDecoder(small)
    right = np.zeros((len(callers), len(grid)), dtype=bool)
    decodes = 0
    for row, (ex, s) in enumerate(zip(tqdm(callers, desc="keep threshold, end to end", unit="ex"), scores)):
        order = torch.argsort(s, descending=True, stable=True).tolist()
        kept = np.clip((s.numpy()[None, :] >= grid[:, None]).sum(1), 1, top_k)  # what the rule keeps at each t
        exact = {}
        for n in sorted(set(kept.tolist())):
            tools = [ex.tools[i] for i in order[:n]]
            prompt = build_small_prompt(small, ex.query, tools)
            with torch.inference_mode():
                step = small.forward(embeds=prompt_embeds(small, projector, prompt, embeddings[ex.id][0]))
            calls = decoder.decode(step, tools, require_call=True, draft_source=ex.query).calls
            exact[n] = same_calls(calls, ex.answers)
            decodes += 1
        right[row] = [exact[n] for n in kept]
    counts = right.sum(0)
    best = plateau_middle(counts)
    before = retriever.config.threshold
    retriever.config.threshold = float(grid[best])
    at_before = int(counts[max(0, np.searchsorted(grid, before, side="right") - 1)])  # the grid point at or below it
    # The curve where it changes (a step function of t), for reports.
    steps = [i for i in range(len(grid)) if i == 0 or counts[i] != counts[i - 1]]
    return {
        "threshold": retriever.config.threshold, "retrieval_threshold": before, "requests": len(callers),
        "exact_calls": int(counts[best]), "exact_calls_at_retrieval_threshold": at_before, "decodes": decodes,
        "curve": [[float(grid[i]), int(counts[i])] for i in steps],
    }


# ---------------------------------------------------------------------------------------------
# the whole preparation


def prepare_gate(out: Path, encoder: SoftTokenEncoder, examples: Sequence[Example], large_model: str, seed: int) -> dict:
    """Train the off-topic gate on the whole data's split and save it in `out` (kept if already
    there: a resumed run does not pay its large-model passes again); returns its metrics."""
    if (out / MANIFEST).is_file():
        return OffTopicGate.load(out).config.metrics
    gate = train_gate(examples, lambda query, tools: encoder.encode(query, tools).soft_token, large_model, seed=seed)
    gate.save(out)
    return gate.config.metrics


def add_gate(artifact: Path, data: Sequence[str], seed: int = 0, large: Backend | None = None) -> dict:
    """Train (again) the off-topic gate of an existing cascade artifact on `data`, leaving its
    other parts as they are; the manifest records the gate's data and metrics. Returns them."""
    manifest_path = artifact / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    large = large or Backend(manifest["large_model"])
    shutil.rmtree(artifact / GATE_DIR, ignore_errors=True)
    everything = load_examples(list(data))
    started = time.perf_counter()
    metrics = prepare_gate(artifact / GATE_DIR, SoftTokenEncoder(large), everything, manifest["large_model"], seed)
    manifest["config"]["off_topic_gate"] = True
    manifest["metrics"]["off_topic_gate"] = {**metrics, "data": {"paths": list(data), "sha256": data_hash(list(data))}}
    manifest.setdefault("seconds", {})["off_topic_gate"] = time.perf_counter() - started
    write_manifest(artifact, manifest)
    return metrics


def model_record(backend: Backend, name: str) -> dict:
    from hyfunc.models.registry import DEFAULT_MODELS

    record = {"name": name, "hidden_size": backend.hidden_size, "dtype": str(backend.model.dtype).removeprefix("torch.")}
    if name in DEFAULT_MODELS:
        record["gguf_sha256"] = DEFAULT_MODELS[name].sha256
    return record


def _earlier_runs(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    previous = json.loads(path.read_text())
    return previous.get("earlier_runs", []) + [{"seconds": previous.get("seconds", {})}]


def _check_split(train: Sequence[Example], val: Sequence[Example], val_fraction: float) -> None:
    """Refuse, before any model loads, data too small to fit a retriever and calibrate it."""
    calls_train, calls_val = sum(1 for ex in train if ex.answers), sum(1 for ex in val if ex.answers)
    if calls_train < 2 or calls_val < 1:
        raise InputError(
            f"too little data: {len(train)} training and {len(val)} validation examples (a {val_fraction:.0%} split by "
            f"id), {calls_train} and {calls_val} of them with calls; at least 2 and 1 are needed, and a useful "
            "cascade needs hundreds (the shipped one: 700 fc-train examples)"
        )


def prepare(config: PrepareConfig, out: Path, large: Backend | None = None, small: Backend | None = None) -> dict:
    """Run (or resume) every stage; returns the manifest. Backends may be passed in (tests)."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    everything = load_examples(config.data)
    examples = sample_by_pattern(everything, config.max_examples, config.seed) if config.max_examples else everything
    train, val = split_examples(examples, config.val_fraction)
    _check_split(train, val, config.val_fraction)
    # Schema variants of training requests only: validation stays as the sources wrote it.
    train = train + schema_variants(train, config.schema_fraction, config.seed) if config.schema_fraction else train
    train = augment_refusals(train, config.refusal_fraction, config.seed)
    val = augment_refusals(val, config.refusal_fraction, config.seed + 1)
    # The whole data's split (the same hash split, a superset of a sample's): the library
    # retriever trains on all of it, and repeated-call examples are joined from all of it.
    all_train, all_val = split_examples(everything, config.val_fraction)
    if config.repeat_fraction:
        train += repeated_examples(all_train, int(len(train) * config.repeat_fraction), config.seed)
        val += repeated_examples(all_val, int(len(val) * config.repeat_fraction), config.seed + 1)

    large = large or Backend(config.large_model)
    compute_embeddings(SoftTokenEncoder(large), train + val, out / "embeddings", config.shard_size)
    embeddings = load_embeddings(out / "embeddings", {ex.id for ex in train + val})
    timings = {"embeddings": time.perf_counter() - started}

    start = time.perf_counter()
    retriever, retriever_metrics = prepare_retriever(
        out / "retriever", retrieval_data(train, embeddings, lexical=False), retrieval_data(val, embeddings),
        large.hidden_size, dict(config.retriever), config.seed,
    )
    timings["retriever"] = time.perf_counter() - start

    library_metrics = None
    if config.library:
        start = time.perf_counter()
        # Request-only soft tokens are cheap: every example of the data that calls library tools
        # (not only the sample) trains it.
        _, library_metrics = train_library_retriever(
            out / "library_retriever", SoftTokenEncoder(large), config.library, all_train, all_val,
            dict(config.retriever), config.seed,
        )
        timings["library_retriever"] = time.perf_counter() - start

    gate_metrics = None
    if config.off_topic_gate:
        start = time.perf_counter()
        gate_metrics = prepare_gate(out / GATE_DIR, SoftTokenEncoder(large), all_train + all_val, config.large_model,
                                    config.seed)
        timings["off_topic_gate"] = time.perf_counter() - start

    next_step_metrics = None
    if config.next_step_per_source:
        start = time.perf_counter()
        try:
            record = train_next_step(out / NEXT_STEP_DIR, large, everything, config.next_step_per_source,
                                     out / "embeddings" / "next_step", config.seed)
            next_step_metrics = {k: record[k] for k in ("conversations", "threshold", "held_out")}
        except OneKindOnly as err:  # the cascade still answers; after tool results as without a head
            log.warning("no next-step head: %s", err)
            next_step_metrics = {"skipped": str(err)}
        timings["next_step"] = time.perf_counter() - start

    start = time.perf_counter()
    # fp32 for the small model: it is trained here (LoRA + projector), and it is cheap anyway.
    small = small or Backend(config.small_model, dtype=torch.float32)
    items, skipped = sft_items(train, embeddings, retriever, small, TemplateDecoder(small))
    if config.sft_max_items:
        items = sample_by_pattern(items, config.sft_max_items, config.seed, pattern=lambda item: item.pattern)
    projector, sft_metrics = train_small(out, small, large.hidden_size, items, config)
    sft_metrics["skipped_examples"] = skipped
    timings["sft"] = time.perf_counter() - start
    small_record = model_record(small, config.small_model)  # as trained (fp32), before the merge below

    if "end_to_end" not in retriever_metrics:
        start = time.perf_counter()
        # The small model as the cascade runs it (hyfunc.methods.cascade.HyFuncMethod.load): adapter merged, default precision.
        if config.lora_rank:
            small.model = small.model.merge_and_unload()
        small.model.to(default_dtype(small.device)).eval()
        retriever_metrics["end_to_end"] = calibrate_keep_threshold(retriever, val, embeddings, small, projector)
        retriever.save(out / "retriever", meta={"metrics": retriever_metrics})
        timings["end_to_end_threshold"] = time.perf_counter() - start

    manifest = {
        "format": "hyfunc-cascade",
        "version": 1,
        "large_model": config.large_model,
        "small_model": config.small_model,
        "models": {"large": model_record(large, config.large_model), "small": small_record},
        "data": {"paths": config.data, "sha256": data_hash(config.data), "train": len(train), "validation": len(val)},
        "config": asdict(config),
        "metrics": {"retriever": retriever_metrics, "sft": sft_metrics, **({"library_retriever": library_metrics} if library_metrics else {}),
                    **({"off_topic_gate": gate_metrics} if gate_metrics else {}),
                    **({"next_step": next_step_metrics} if next_step_metrics else {})},
        "seconds": timings,
        # A resumed run skips finished stages, so its own times understate them: keep earlier runs' times.
        "earlier_runs": _earlier_runs(out / MANIFEST),
    }
    write_manifest(out, manifest)
    return manifest
