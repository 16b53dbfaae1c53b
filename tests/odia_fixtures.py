"""Tiny random models saved to disk, and a tiny cascade artifact made of them: what the CLI
commands of learning from traffic load by name (`--artifact`, a model path), without weights."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hyfunc.cascade.retriever import Retriever, RetrieverConfig
from hyfunc.cascade.small_model import SoftTokenProjector, save_projector
from tests.serve_app import LARGE_HIDDEN, SMALL_HIDDEN
from tests.tiny_models import tiny_backend

if TYPE_CHECKING:
    from hyfunc.routing.router import Router


def save_tiny_model(directory: Path, hidden: int, seed: int) -> Path:
    """A saved Hugging Face model directory (config, weights, tokenizer with its chat template)."""
    if not (directory / "config.json").is_file():
        backend = tiny_backend(hidden, seed=seed)
        backend.model.save_pretrained(directory)
        backend.tokenizer.save_pretrained(directory)
    return directory


def tiny_artifact(directory: Path, refusal_threshold: float = -1.0) -> Path:
    """A cascade artifact (as `hyfunc prepare` writes one) over two saved tiny models; its
    retriever keeps every offered tool (threshold -1), so the small model always writes calls."""
    if (directory / "manifest.json").is_file():
        return directory
    large = save_tiny_model(directory.parent / f"{directory.name}-large", LARGE_HIDDEN, 1)
    small = save_tiny_model(directory.parent / f"{directory.name}-small", SMALL_HIDDEN, 2)
    torch.manual_seed(3)
    config = RetrieverConfig(query_dim=LARGE_HIDDEN, function_dim=LARGE_HIDDEN, proj_dim=8, threshold=-1.0, top_k=3,
                             refusal_threshold=refusal_threshold)
    Retriever(config).eval().save(directory / "retriever")
    save_projector(SoftTokenProjector(LARGE_HIDDEN, SMALL_HIDDEN), directory)
    manifest = {"format": "hyfunc-cascade", "version": 1, "large_model": str(large), "small_model": str(small)}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


SHORT = "Weather in Paris?"
LONG = ("I am planning a long trip across several countries next month and would like to know, for each of the "
        "cities on my way, what the weather will be like, and also book tables for dinner in two of them.")


def length_router(threshold: float | None = None, small_first: bool = False) -> "Router":
    """A router learned from labels that call short requests simple (scalar features only, no
    embedder): short requests go to the small path, long ones to the cascade. `small_first`: it
    also reads the small path's answer (labelled with one call at confidence 0.5 throughout, so
    the length still decides)."""
    from hyfunc.routing.features import scalar_features
    from hyfunc.routing.router import RoutingExample, train_router
    from tests.test_serve_sdk import TOOLS

    examples = []
    small_answer = ([{"name": "ping", "arguments": {}}], 0.5) if small_first else (None, None)
    for i in range(40):
        short = i % 2 == 0
        text = (SHORT if short else LONG) + " " * (i % 5)
        features = scalar_features([{"role": "user", "content": text}], TOOLS, *small_answer)
        examples.append(RoutingExample(features, None, short, float(i)))
    router = train_router(examples, target=0.99, use_small_answer=small_first)
    if threshold is not None:
        router.threshold = router.manifest["threshold"] = threshold
    return router


def tiny_version(directory: Path, small_model: Path, threshold: float | None = None, small_first: bool = False) -> Path:
    """A version directory as a cycle writes one: router/ and small/ (the tiny small model, no
    adapter, an identity MiniLM selector that keeps the best tools)."""
    from hyfunc.models.minilm import MINILM_NAME
    from hyfunc.routing.routed import SMALL_MANIFEST, small_description
    from hyfunc.cascade.selector import identity_selector

    length_router(threshold, small_first).save(directory / "router")
    selector = identity_selector()
    selector.config.lexical_weight, selector.config.threshold, selector.config.refusal_threshold = 1.0, 0.9, -1.0
    selector.save(directory / "small" / "selector", meta={"embedder": MINILM_NAME})
    (directory / "small" / SMALL_MANIFEST).write_text(json.dumps(small_description(str(small_model), adapter=None)))
    return directory


class ListSink:
    """A TrafficSink that keeps what it gets in a list, or fails like a full disk (`fail=True`)."""

    def __init__(self, fail: bool = False) -> None:
        self.records: list = []
        self.fail = fail

    def record(self, request) -> None:
        if self.fail:
            raise OSError("disk full")
        self.records.append(request)


def permissive_selector(directory: Path) -> Path:
    """The untrained (identity) MiniLM selector with thresholds that keep the matching tools and
    never refuse: tiny models' tests need tools to reach the small path."""
    from hyfunc.cascade.selector import identity_selector
    from hyfunc.models.minilm import MINILM_NAME

    selector = identity_selector()
    selector.config.lexical_weight, selector.config.threshold, selector.config.refusal_threshold = 1.0, 0.9, -1.0
    selector.save(directory, meta={"embedder": MINILM_NAME})
    return directory
