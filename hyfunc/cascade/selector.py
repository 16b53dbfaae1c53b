"""Tool selection for the small path, without the large model: BM25 fused with MiniLM embeddings.

The cascade selects tools with the large model's soft token; a routed request must not pay for
that pass. Here the request and each tool are embedded with all-MiniLM-L6-v2 (22M parameters, a
few milliseconds per request on a CPU; tool vectors are cached), and the cascade's own `Retriever`
runs on those vectors instead of the large model's: the same projections (trained with the same
InfoNCE on fc-train's train split, or the identity: MiniLM's cosine as it is), the same fusion
with the request's BM25 scores (lexical.py), the same selection rule, and the same calibration on
fc-train's validation split: the lexical weight, the keep threshold, and the "no tool fits"
threshold on the best cosine (the refusal head of the cascade needs a state that has read the
tools; a MiniLM vector of the request alone has not, so answerability is the best cosine).

A selector directory is a saved `Retriever` (manifest.json + retriever.safetensors) whose
`meta` names the embedder and the tool text, and records the calibration (`prepare_selector`).
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import torch

from hyfunc.cascade.data import Example, augment_refusals, load_examples, split_examples
from hyfunc.cascade.lexical import LexicalIndex, fit_lexical_weight, tool_text
from hyfunc.cascade.retriever import (
    RetrievalData,
    Retriever,
    RetrieverConfig,
    calibrate,
    evaluate,
    new_retriever,
    train_retriever,
)
from hyfunc.formats.schema import Tool
from hyfunc.models.minilm import MINILM_NAME, Embedder, MiniLMEmbedder

TOOL_TEXT = "lexical.tool_text"  # what a tool is embedded by (name in words, description, parameters)
SELECTOR_OPTIONS = {"proj_dim": 256, "mlp_hidden": 0, "epochs": 30, "lr": 1e-3, "refusal_head": False}
LIBRARY_INDEX_MIN = 64  # offered lists at least this long keep their BM25 index between requests


def default_selector_dir() -> Path:
    """The selector shipped with the package (`hyfunc odia selector --data fc-train` made it)."""
    return Path(__file__).resolve().parents[1] / "data" / "selector"


class ToolVectors:
    """MiniLM vectors of tools, cached by the tool's schema (a server sees the same tools again
    and again); least recently used entries go past `capacity`. Thread-safe: the gate, the
    router's selector and a cycle's candidate may share one cache (`tool_vectors_for`)."""

    def __init__(self, embedder: Embedder, capacity: int = 100_000):
        self.embedder, self.capacity = embedder, capacity
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(tool: Tool) -> str:
        return json.dumps(tool.to_json_schema(), sort_keys=True, ensure_ascii=False)

    def __call__(self, tools: Sequence[Tool]) -> torch.Tensor:
        keys = [self.key(t) for t in tools]
        with self._lock:
            missing = list(dict.fromkeys(k for k in keys if k not in self._cache))
            if missing:
                by_key = {self.key(t): t for t in tools}
                vectors = torch.from_numpy(self.embedder.embed([tool_text(by_key[k]) for k in missing])).float()
                for k, v in zip(missing, vectors):
                    self._cache[k] = v
            for k in keys:
                self._cache.move_to_end(k)
            out = torch.stack([self._cache[k] for k in keys]) if keys else torch.empty(0, 0)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
            return out

    def adopt(self, other: "ToolVectors") -> None:
        """Take `other`'s vectors (computed by the same model) that this cache lacks."""
        with other._lock:
            entries = list(other._cache.items())
        with self._lock:
            for k, v in entries:
                self._cache.setdefault(k, v)


def tool_vectors_for(embedder: Embedder) -> ToolVectors:
    """The embedder's own tool-vector cache when it carries one (the routing's SharedEmbedder:
    a 4,000-tool library is then embedded once per process, not once per gate, selector and
    version), else a new cache."""
    shared = getattr(embedder, "tool_vectors", None)
    return shared if isinstance(shared, ToolVectors) else ToolVectors(embedder)


def identity_selector(dim: int = MiniLMEmbedder.dim) -> Retriever:
    """A retriever whose projections are the identity: MiniLM's own cosine (before calibration,
    selection thresholds are the Retriever's defaults)."""
    retriever = Retriever(RetrieverConfig(query_dim=dim, function_dim=dim, proj_dim=dim))
    with torch.no_grad():
        for proj in (retriever.query_proj, retriever.function_proj):
            proj.weight.copy_(torch.eye(dim))
            proj.bias.zero_()
    return retriever.eval()


def selector_data(examples: Sequence[Example], embedder: Embedder, vectors: ToolVectors) -> RetrievalData:
    """RetrievalData over MiniLM vectors (requests, each example's tools) with BM25 scores."""
    queries = torch.from_numpy(embedder.embed([ex.query for ex in examples])).float() if examples else torch.empty(0, 0)
    functions, candidates, positives, keys, lexical = [], [], [], [], []
    for ex in examples:
        start = len(keys)
        functions.append(vectors(ex.tools) if ex.tools else torch.empty(0, queries.shape[1]))
        candidates.append(list(range(start, start + len(ex.tools))))
        gold = {c.name for c in ex.answers}
        positives.append([start + i for i, t in enumerate(ex.tools) if t.name in gold])
        keys += [ToolVectors.key(t) for t in ex.tools]
        lexical.append(LexicalIndex(ex.tools).scores(ex.query) if ex.tools else torch.empty(0))
    return RetrievalData(queries, torch.cat(functions), candidates, positives, keys, lexical)


def prepare_selector(data: Sequence[str], out: str | Path, *, train: bool = True, embedder: Embedder | None = None,
                     options: dict | None = None, seed: int = 0, max_train: int | None = None,
                     refusal_fraction: float = 0.15) -> tuple[Retriever, dict]:
    """Train (or take the identity) and calibrate a selector on fc-train; save it in `out`.
    Projections on the train split; lexical weight and thresholds on the validation split with
    refusal examples made from it (augment_refusals: near misses and unrelated tool lists), the
    split `hyfunc prepare` uses, so the cascade's retriever was fitted on the same requests."""
    embedder = embedder or MiniLMEmbedder()
    vectors = ToolVectors(embedder)
    started = time.perf_counter()
    train_split, val_split = split_examples(load_examples(list(data)))
    val_split = augment_refusals(val_split, refusal_fraction, seed + 1)
    val = selector_data(val_split, embedder, vectors)
    metrics: dict[str, Any] = {"validation_examples": len(val_split)}
    if train:
        examples = train_split[:max_train] if max_train else train_split
        retriever, training = new_retriever(MiniLMEmbedder.dim, {**SELECTOR_OPTIONS, **(options or {})}, seed)
        metrics["loss_history"] = train_retriever(retriever, selector_data(examples, embedder, vectors), seed=seed, **training)
        metrics["train_examples"] = len(examples)
    else:
        retriever = identity_selector()
    metrics["lexical_fit"] = fit_lexical_weight(retriever, val, k=None)
    metrics["calibration"] = calibrate(retriever, val)
    metrics["validation"] = evaluate(retriever, val)
    metrics["seconds"] = time.perf_counter() - started
    meta = {"embedder": getattr(embedder, "name", MINILM_NAME), "tool_text": TOOL_TEXT, "trained": train,
            "data": [str(p) for p in data], "metrics": metrics}
    retriever.save(out, meta=meta)
    return retriever, metrics


class ToolSelector:
    """Which of the offered tools the small path reads for a request; [] = no tool fits."""

    def __init__(self, retriever: Retriever, embedder: Embedder | None = None):
        name = retriever.meta.get("embedder", MINILM_NAME)
        if embedder is not None and getattr(embedder, "name", None) != name:
            raise ValueError(f"selector was calibrated on {name} vectors, not {getattr(embedder, 'name', None)}")
        self.retriever = retriever.eval()
        self.embedder: Embedder = embedder or MiniLMEmbedder()
        self.vectors = tool_vectors_for(self.embedder)
        self._index: tuple[str, LexicalIndex] | None = None  # the last long list's BM25 index

    @classmethod
    def load(cls, directory: str | Path, embedder: Embedder | None = None) -> "ToolSelector":
        return cls(Retriever.load(directory), embedder)

    def _lexical(self, request: str, tools: Sequence[Tool]) -> torch.Tensor:
        if len(tools) < LIBRARY_INDEX_MIN:
            return LexicalIndex(tools).scores(request)  # under a millisecond for a short list
        key = "\n".join(ToolVectors.key(t) for t in tools)
        if self._index is None or self._index[0] != key:
            self._index = (key, LexicalIndex(tools))
        return self._index[1].scores(request)

    @torch.no_grad()
    def rank(self, request: str, tools: Sequence[Tool]) -> tuple[torch.Tensor, float]:
        """(fused scores of the tools, answerability: the best cosine)."""
        if not tools:
            return torch.empty(0), float("-inf")
        query = torch.from_numpy(self.embedder.embed([request])).float()[0]
        cosine = self.retriever.scores(query, self.vectors(tools))
        lexical = self._lexical(request, tools) if self.retriever.config.lexical_weight else None
        answerable = float(self.retriever.answerability(query.unsqueeze(0), [cosine])[0])
        return self.retriever.fuse(cosine, lexical), answerable

    def select(self, request: str, tools: Sequence[Tool]) -> list[int]:
        scores, answerable = self.rank(request, tools)
        return self.retriever.select_from_scores(scores, answerable) if len(tools) else []
