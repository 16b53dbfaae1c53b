"""Refit the retriever's refusal head ("does an offered tool fit?") on requests shown many tools.

The head (`retriever.train_refusal_head`: logistic regression on the soft token) learns from
fc-train's requests, each shown a handful of tools of its own domain, and from refusal examples
made of them (`data.augment_refusals`). On BFCL's live categories it refused call requests whose
tools look unlike fc-train's (a food-order tool named `ChaFod`, appliance commands): 17 of the
shipped cascade's wrong answers there were "no tool fits" (reports/refusal-head/).

Here the head is fitted again, the rest of the cascade left as it is: on the whole data's
training split and its refusal examples, plus copies of a share of them shown 2..`max_extra`
random tools of a large library (`data.pad_with_tools`), so that "a tool fits" is also learned
among many unrelated tools. Its threshold and L2 weight are chosen on the validation split
(padded likewise): the threshold at which `answered_share` (default 99 %, as the ODIA router's
agreement target) of the call requests are answered, for a refused call is a silent failure; the
weight by the share of no-call requests refused at that threshold, the largest weight within
`tolerance` of the best, since a smoother head is the one more likely to hold on tools nobody
trained on. (`prepare` calibrates by balanced accuracy instead; on this validation split that
refused 3.3 % of the call requests with the refitted head: reports/refusal-head/.)
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from hyfunc.cascade.data import (
    Example,
    augment_refusals,
    load_examples,
    pad_with_tools,
    sample_by_pattern,
    split_examples,
)
from hyfunc.cascade.library import load_library
from hyfunc.cascade.manifest import MANIFEST, write_manifest
from hyfunc.cascade.prepare import compute_embeddings, data_hash, load_embeddings, retrieval_data
from hyfunc.cascade.retriever import (
    RetrievalData,
    Retriever,
    example_cosines,
    threshold_for_answered_share,
    train_refusal_head,
)
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.models.backend import Backend

L2_GRID = (1e-3, 1e-2, 1e-1, 1.0)


def refusal_rates(model: Retriever, data: RetrievalData, examples: Sequence[Example]) -> dict[str, dict]:
    """Per kind of example (own tools / padded, with a call / without): how many, and the share refused."""
    answerable = model.answerability(data.queries, example_cosines(model, data)).numpy()
    refused = answerable < model.config.refusal_threshold
    groups: dict[str, list[bool]] = {}
    for ex, r in zip(examples, refused):
        kind = ("padded" if ex.source.endswith("~padded") else "own tools") + (", call" if ex.answers else ", no call")
        groups.setdefault(kind, []).append(bool(r))
    return {k: {"n": len(v), "refused": sum(v) / len(v)} for k, v in sorted(groups.items())}


def _masks(data: RetrievalData) -> tuple[np.ndarray, np.ndarray]:
    offered = np.array([bool(c) for c in data.candidates])
    calls = np.array([bool(p) for p in data.positives])
    return offered & calls, offered & ~calls


def refit_refusal_head(
    artifact: Path, data: Sequence[str], library: str, padding: float = 0.5, max_extra: int = 8,
    l2_grid: Sequence[float] = L2_GRID, answered_share: float = 0.99, tolerance: float = 0.01, seed: int = 0, val_fraction: float = 0.1,
    refusal_fraction: float = 0.15, max_examples: int | None = None, cache: Path | None = None, large: Backend | None = None,
) -> dict:
    """Refit the refusal head of the cascade in `artifact` in place (see the module's text); the
    retriever's manifest and the cascade's record the data, the choice and the validation rates
    before and after. Large-model embeddings are cached in `cache` (default: artifact/embeddings-refusal;
    resumable). Returns the metrics."""
    started = time.perf_counter()
    manifest = json.loads((artifact / MANIFEST).read_text())
    retriever = Retriever.load(artifact / "retriever")
    if retriever.refusal is None:
        raise ValueError(f"{artifact}: the retriever has no refusal head to refit")
    everything = load_examples(list(data))
    # The cascade's own training sample (embedding time is linear in it); validation is the whole
    # data's split, a superset of the sample's (the same hash split), for a steadier threshold.
    sample = sample_by_pattern(everything, max_examples, seed) if max_examples else everything
    train, _ = split_examples(sample, val_fraction)
    _, val = split_examples(everything, val_fraction)
    train = augment_refusals(train, refusal_fraction, seed)
    val = augment_refusals(val, refusal_fraction, seed + 1)
    pool = load_library(library)
    train += pad_with_tools(train, pool, padding, max_extra, seed)
    val += pad_with_tools(val, pool, padding, max_extra, seed + 1)
    large = large or Backend(manifest["large_model"])
    cache = cache or artifact / "embeddings-refusal"
    compute_embeddings(SoftTokenEncoder(large), train + val, cache, shard_size=64)
    embeddings = load_embeddings(cache, {ex.id for ex in train + val})
    train_data = retrieval_data(train, embeddings, lexical=False)
    val_data = retrieval_data(val, embeddings, lexical=False)
    calls, no_calls = _masks(val_data)
    if not calls.any() or not no_calls.any():
        raise ValueError("the validation split needs requests with and without a call to choose the threshold")

    before = {"refusal_threshold": retriever.config.refusal_threshold, "validation": refusal_rates(retriever, val_data, val)}
    candidates = []
    for l2 in l2_grid:
        model = copy.deepcopy(retriever)
        train_refusal_head(model, train_data, l2=l2)
        answerable = model.answerability(val_data.queries, example_cosines(model, val_data)).numpy()
        model.config.refusal_threshold = threshold_for_answered_share(answerable[calls], answered_share)
        refused = float((answerable[no_calls] < model.config.refusal_threshold).mean())
        candidates.append((l2, refused, model))
    best = max(refused for _, refused, _ in candidates)
    l2, refused, chosen = max((c for c in candidates if c[1] >= best - tolerance), key=lambda c: c[0])
    metrics = {
        "data": {"paths": list(data), "sha256": data_hash(list(data)), "library": library,
                 "max_examples": max_examples, "train": len(train), "validation": len(val)},
        "padding": padding, "max_extra": max_extra, "seed": seed,
        "answered_share": answered_share,
        # per weight: the share of validation no-call requests refused at its threshold
        "l2_grid": {str(c[0]): c[1] for c in candidates}, "l2": l2, "no_calls_refused": refused,
        "before": before,
        "after": {"refusal_threshold": chosen.config.refusal_threshold, "validation": refusal_rates(chosen, val_data, val)},
        "seconds": time.perf_counter() - started,
    }
    retriever_metrics = {**chosen.meta.get("metrics", {}), "refusal_refit": metrics}
    chosen.save(artifact / "retriever", meta={**chosen.meta, "metrics": retriever_metrics})
    manifest["metrics"].setdefault("retriever", {})["refusal_refit"] = metrics
    write_manifest(artifact, manifest)
    return metrics
