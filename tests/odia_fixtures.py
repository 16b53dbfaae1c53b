"""Tiny random models saved to disk, and a tiny cascade artifact made of them: what the CLI
commands of learning from traffic load by name (`--artifact`, a model path), without weights."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from hyfunc.cascade.retriever import Retriever, RetrieverConfig
from hyfunc.cascade.small_model import SoftTokenProjector, save_projector
from tests.serve_app import LARGE_HIDDEN, SMALL_HIDDEN
from tests.tiny_models import tiny_backend


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
