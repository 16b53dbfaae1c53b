"""Train a cascade's next-step head and score it on held-out sources (`hyfunc prepare`, and
`hyfunc prepare --next-step-only` for a cascade already prepared).

1. build agent conversations from fc-train (`agent_steps.py`), up to N of each label per source;
2. one pass of the cascade's large model over each (as served: instruction + tools in the system
   prompt, the conversation in the chat template) -> its soft token; kept in a cache file per
   model and engine, so a rerun runs the model only for conversations it has not seen;
3. leave-one-source-out: each source scored by a head trained on the others; the threshold with
   the best mean accuracy over sources;
4. the head trained on every source, with that threshold, written into the artifact
   (`next_step/`), and the held-out figures into a report.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from hyfunc.cascade.agent_steps import ANSWER, AgentStep, agent_steps, chained_steps
from hyfunc.cascade.data import Example, load_examples
from hyfunc.cascade.manifest import MANIFEST, write_manifest
from hyfunc.cascade.next_step import (
    NEXT_STEP_DIR,
    NextStepConfig,
    OneKindOnly,
    best_threshold,
    fit_head,
    held_out_scores,
)
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.models.base import BackendBase
from hyfunc.models.engines import load_backend

log = logging.getLogger("hyfunc.next_step")
SAVE_EVERY = 25  # conversations encoded between writes of the cache


def step_key(step: AgentStep) -> str:
    """What a conversation's soft token depends on besides the model: its messages and tools."""
    text = json.dumps([step.id, step.messages, [t.to_json_schema() for t in step.tools]], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cache_file(cache_dir: Path, large: BackendBase) -> Path:
    """One file per model and engine, a soft token per conversation (`step_key`)."""
    engine = hashlib.sha256(json.dumps([large.name, large.description]).encode()).hexdigest()[:16]
    return cache_dir / f"soft-tokens-{engine}.safetensors"


def encode_steps(encoder: SoftTokenEncoder, steps: Sequence[AgentStep], cache: Path | None) -> torch.Tensor:
    """(n, H) soft tokens of the conversations; those in `cache` (when given) are read from it,
    the others computed and added to it."""
    known = load_file(str(cache)) if cache is not None and cache.is_file() else {}
    keys = [step_key(s) for s in steps]
    missing = [i for i, k in enumerate(keys) if k not in known]
    # Conversations built from one example share its tools: their [instruction + tools] prefix is
    # run once (exact, as in serving with a fixed library).
    groups: dict[str, list[int]] = {}
    for i in missing:
        groups.setdefault(json.dumps([t.to_json_schema() for t in steps[i].tools], sort_keys=True), []).append(i)

    def save() -> None:
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            save_file(known, str(cache))

    with tqdm(total=len(missing), desc="large-model passes", unit="conversation", disable=not missing) as bar:
        for members in groups.values():
            library = encoder.build_library(steps[members[0]].tools) if len(members) > 1 else None
            for i in members:
                known[keys[i]] = encoder.encode(steps[i].messages, library or steps[i].tools).soft_token.contiguous()
                bar.update()
                if bar.n % SAVE_EVERY == 0:  # an interrupted run keeps what it computed
                    save()
    if missing:
        save()
    return torch.stack([known[k] for k in keys])


def source_figures(scores: torch.Tensor, answers: torch.Tensor, sources: Sequence[str], threshold: float) -> dict:
    """Per source and overall: conversations, accuracy, and each label's recall at `threshold`."""
    out = {}
    for source in [*sorted(set(sources)), "all"]:
        mask = torch.tensor([source in ("all", s) for s in sources])
        said, gold = scores[mask] >= threshold, answers[mask].bool()
        out[source] = {
            "n": int(mask.sum()),
            "accuracy": round(float((said == gold).float().mean()), 4),
            "answer_recall": round(float(said[gold].float().mean()), 4) if gold.any() else None,
            "call_recall": round(float((~said[~gold]).float().mean()), 4) if (~gold).any() else None,
        }
    return out


def train_next_step(out: Path, large: BackendBase, examples: Sequence[Example], per_source: int,
                    cache_dir: Path | None, seed: int = 0, chained_per_source: int = 0) -> dict:
    """Train the head on agent conversations built from `examples` (`chained_per_source`: with
    that many chained requests per source too), save it in `out`; returns the held-out record,
    with the conversations the held-out heads got wrong (`misses`)."""
    steps = agent_steps(examples, per_source, seed)
    steps += [s for s in chained_steps(examples, chained_per_source, seed) if s.after_results]
    answers = torch.tensor([s.label == ANSWER for s in steps])
    if len(set(answers.tolist())) < 2:  # before any model pass
        raise OneKindOnly("the data makes agent conversations of one kind only: the next-step head needs requests "
                          "with several calls, or two sources' requests with distinct tools, too")
    sources = [s.source for s in steps]
    cache = cache_file(cache_dir, large) if cache_dir else None
    start = time.perf_counter()
    soft = encode_steps(SoftTokenEncoder(large), steps, cache)
    seconds = time.perf_counter() - start
    config = NextStepConfig(large_model=large.name)
    scores = held_out_scores(soft, answers, sources, config)
    config.threshold = best_threshold(scores, answers, sources)
    record = {
        "conversations": len(steps),
        "per_source": per_source,
        "chained_per_source": chained_per_source,
        "seed": seed,
        "engine": large.description,
        "encode_seconds": round(seconds, 1),
        "threshold": config.threshold,
        "held_out": source_figures(scores, answers, sources, config.threshold),
        "held_out_at_0.5": source_figures(scores, answers, sources, 0.5),
    }
    config.training = dict(record)
    fit_head(soft, answers, config).save(out)
    record["misses"] = [
        {"id": s.id, "source": s.source, "label": s.label, "p_answer": round(float(p), 4)}
        for s, p in zip(steps, scores) if (float(p) >= config.threshold) != (s.label == ANSWER)
    ]
    return record


def add_next_step(artifact: Path, data: Sequence[str], per_source: int, engine: str, cache_dir: Path | None,
                  seed: int = 0) -> dict:
    """(Re)train the head of the prepared cascade in `artifact` on `data`, with its large model;
    the held-out figures go into its manifest too."""
    manifest = json.loads((artifact / MANIFEST).read_text())
    large = load_backend(manifest["large_model"], engine, role="large")
    record = train_next_step(artifact / NEXT_STEP_DIR, large, load_examples(list(data)), per_source, cache_dir, seed)
    record["data"] = [str(d) for d in data]
    manifest.setdefault("metrics", {})["next_step"] = {k: record[k] for k in ("conversations", "threshold", "held_out")}
    write_manifest(artifact, manifest)
    return record
