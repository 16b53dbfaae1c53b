"""A tool library too large for one prompt (e.g. the bundled Seal-Tools library, hyfunc.data.TOOL_LIBRARY, ~4,000 tools).

Read in per-function mode: each tool embedded in its own [instruction + tool] prompt (causal
attention makes that the embedding it would have as the first tool of a list), and each request
by a soft token over [instruction + request] with no tools. Both differ from the joint-prompt
embeddings the default retriever is trained on, so a library gets its own retriever
(`train_library_retriever`), trained on fc-train requests whose gold tools are in the library,
whose score adds a lexical (BM25) part (lexical.py).

A library request often asks for several unrelated tools in several sentences ("check the warehouse
capacity ... then get the library layout ... finally ..."), and one soft token of the whole request
leans to the first of them. So the library retriever queries per sentence: each sentence gets its
own soft token ([instruction + sentence], all in one batched pass) and its own BM25 scores, and a tool scores by
the sentence that asks for it best (`Retriever.fuse`). The projections are still trained on whole
requests; the lexical weight and the thresholds are fitted on per-sentence scores. On the 209
held-out requests of `hyfunc bench retriever` (same projections) recall@5 rose from 94.2 % to
96.0 %, the cosine alone from 46.3 % to 64.4 %.

Library embeddings are computed once and cached in shards under
``$HYFUNC_HOME/library-embeddings/<model>-<hash>/``, so an interrupted run resumes and later runs
start at once; the retriever's projection of the whole library is then one matrix. That directory
is bounded in bytes (`DISK_CACHE_BYTES` by default): the least recently used libraries go first,
never one being written or read (hyfunc.disk_cache).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from hyfunc.cascade.data import Example
from hyfunc.cascade.lexical import (
    LexicalIndex,
    fit_lexical_weight,
    fusion_split,
    sentences,
)
from hyfunc.cascade.manifest import MANIFEST
from hyfunc.cascade.retriever import (
    RetrievalData,
    Retriever,
    calibrate,
    evaluate,
    new_retriever,
    train_retriever,
)
from hyfunc.cascade.shards import fill_shards, read_shards
from hyfunc.cascade.soft_token import SoftTokenEncoder, tool_line
from hyfunc.config import hyfunc_home
from hyfunc.disk_cache import hold, trim
from hyfunc.durable import durable_replacement
from hyfunc.errors import InputError
from hyfunc.formats.schema import Tool, parse_tools


def load_library(path: str | Path) -> list[Tool]:
    """Tools from a JSON Lines file (one schema per line) or a directory of them."""
    path = Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise InputError(f"{path}: no .jsonl tool files")
    raw = [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    return parse_tools(raw)


def in_library(examples: Sequence[Example], library: Sequence[Tool]) -> list[Example]:
    """Examples that call tools, all of them in the library (by name)."""
    names = {t.name for t in library}
    return [ex for ex in examples if ex.answers and all(c.name in names for c in ex.answers)]


#: Bytes the cached library embeddings may take on disk: about 80 libraries of 4,000 tools with the shipped
#: large model (H=1536, float32: 25 MB each).
DISK_CACHE_BYTES = 2 * 1024**3
SHARD_SIZE = 256  # tools per cached shard


def _embeddings_directory(encoder: SoftTokenEncoder, tools: Sequence[Tool]) -> Path:
    """Where the library's embeddings are cached: keyed by model, instruction and tools."""
    digest = hashlib.sha256("\n".join([encoder.backend.name, encoder.instruction, *map(tool_line, tools)]).encode()).hexdigest()
    return hyfunc_home() / "library-embeddings" / f"{encoder.backend.name.replace('/', '_')}-{digest[:16]}"


def _shard_paths(directory: Path, n_tools: int) -> list[Path]:
    return [directory / f"{number:05d}.safetensors" for number in range((n_tools + SHARD_SIZE - 1) // SHARD_SIZE)]


def embeddings_stored(encoder: SoftTokenEncoder, tools: Sequence[Tool]) -> bool:
    """Whether `library_embeddings` would find every shard on disk (and compute nothing)."""
    return all(path.is_file() for path in _shard_paths(_embeddings_directory(encoder, tools), len(tools)))


class LibraryEmbedding:
    """A library's per-function embeddings, computed a few tools at a time (`step`: the server embeds
    a new library between requests) and cached on disk a shard at a time. The tools of a shard not
    yet finished are held in memory: a step dropped half-way through a shard loses at most that shard.
    When the last shard is written, the disk cache is trimmed to `max_bytes`, least recently used
    libraries first (this one always stays)."""

    def __init__(self, encoder: SoftTokenEncoder, tools: Sequence[Tool], max_bytes: int = DISK_CACHE_BYTES):
        self.encoder, self.tools, self.max_bytes = encoder, list(tools), max_bytes
        self.directory = _embeddings_directory(encoder, self.tools)
        self._shards = _shard_paths(self.directory, len(self.tools))
        self._partial: list[torch.Tensor] = []  # embedded tools of shard `_partial_shard`, in order
        self._partial_shard: int | None = None

    def _next_shard(self) -> int | None:
        return next((number for number, path in enumerate(self._shards) if not path.is_file()), None)

    def _shard_tools(self, number: int) -> list[Tool]:
        return self.tools[number * SHARD_SIZE : (number + 1) * SHARD_SIZE]

    @property
    def remaining(self) -> int:
        """Tools not embedded yet (another process may write shards meanwhile: read from disk)."""
        missing = [number for number, path in enumerate(self._shards) if not path.is_file()]
        held = sum(len(part) for part in self._partial) if self._partial_shard in missing else 0
        return sum(len(self._shard_tools(number)) for number in missing) - held

    def step(self, max_tools: int) -> int:
        """Embed up to `max_tools` more tools, all of one shard; returns how many (0 when done)."""
        number = self._next_shard()
        if number is None:
            return 0
        if number != self._partial_shard:  # a new shard, or the one held was written elsewhere
            self._partial, self._partial_shard = [], number
        chunk = self._shard_tools(number)
        done = sum(len(part) for part in self._partial)
        part = chunk[done : done + max(1, max_tools)]
        with hold(self.directory):
            self._partial.append(self.encoder.embed_functions(part))
            if done + len(part) == len(chunk):
                with durable_replacement(self._shards[number]) as shard:  # a shard is there whole or not at all
                    save_file({"functions": torch.cat(self._partial)}, str(shard))
                self._partial, self._partial_shard = [], None
                if self._next_shard() is None:  # only a write grows the cache: a read needs no walk over every entry
                    trim(self.directory.parent, self.max_bytes)
        return len(part)

    def load(self) -> torch.Tensor:
        """(n_tools, H) from the finished shards on disk."""
        with hold(self.directory):
            return torch.cat([load_file(str(path))["functions"] for path in self._shards])


def library_embeddings(encoder: SoftTokenEncoder, tools: list[Tool], max_bytes: int = DISK_CACHE_BYTES) -> torch.Tensor:
    """(n_tools, H) per-function embeddings, computed where no shard of them is on disk yet (see
    `LibraryEmbedding`)."""
    embedding = LibraryEmbedding(encoder, tools, max_bytes)
    remaining = embedding.remaining
    if remaining:
        with tqdm(total=len(tools), initial=len(tools) - remaining, desc="library embeddings", unit="tool") as bar:
            while done := embedding.step(SHARD_SIZE):
                bar.update(done)
    return embedding.load()


def request_tokens(encoder: SoftTokenEncoder, examples: Sequence[Example], directory: Path, shard_size: int = 128) -> torch.Tensor:
    """(n, H) request-only soft tokens, cached in id-keyed shards under `directory` (resumable)."""
    by_id = {ex.id: ex for ex in examples}

    def compute(ids: list[str], tick) -> dict[str, torch.Tensor]:
        tokens = []
        for ex_id in ids:
            tokens.append(encoder.encode_request(by_id[ex_id].query).soft_token)
            tick()
        return {"soft_tokens": torch.stack(tokens)}

    fill_shards(directory, list(by_id), compute, shard_size, "request soft tokens")
    cached = {i: row for held, tensors in read_shards(directory, set(by_id)) for i, row in zip(held, tensors["soft_tokens"])}
    return torch.stack([cached[ex.id] for ex in examples])


def sentence_queries(encoder: SoftTokenEncoder, request: str, whole: torch.Tensor) -> torch.Tensor:
    """(S, H): what a per-sentence retriever scores `request` with: the soft token of [instruction +
    sentence] for each of `sentences(request)`, batched; a one-sentence request keeps `whole`, its
    own soft token, and costs no extra pass."""
    parts = sentences(request)
    return encoder.encode_requests(parts) if len(parts) > 1 else whole[None]


def request_sentence_tokens(encoder: SoftTokenEncoder, examples: Sequence[Example], directory: Path, shard_size: int = 64) -> list[torch.Tensor]:
    """Per example the soft tokens of its sentences, cached in id-keyed shards under `directory` (resumable)."""
    by_id = {ex.id: ex for ex in examples}

    def compute(ids: list[str], tick) -> dict[str, torch.Tensor]:
        tokens = []
        for ex_id in ids:
            tokens.append(encoder.encode_requests(sentences(by_id[ex_id].query)))
            tick()
        return {"soft_tokens": torch.cat(tokens), "counts": torch.tensor([len(t) for t in tokens])}

    fill_shards(directory, list(by_id), compute, shard_size, "request sentence soft tokens")
    cached = {}
    for held, tensors in read_shards(directory, set(by_id)):
        cached.update(zip(held, torch.split(tensors["soft_tokens"], tensors["counts"].tolist())))
    return [cached[ex.id] for ex in examples]


def library_retrieval_data(
    queries: torch.Tensor, functions: torch.Tensor, examples: Sequence[Example], library: Sequence[Tool],
    lexical: LexicalIndex | None = None, sentence_queries: list[torch.Tensor] | None = None,
) -> RetrievalData:
    """Every example's candidates are the whole library; its positives the tools its answer calls;
    with `lexical`, each request's lexical scores of the library (per sentence with `sentence_queries`)."""
    index = {t.name: i for i, t in enumerate(library)}
    everything = list(range(len(library)))
    positives = [sorted({index[c.name] for c in ex.answers}) for ex in examples]
    scores = None
    if lexical is not None:
        scores = [lexical.sentence_scores(ex.query) for ex in examples] if sentence_queries is not None else list(lexical.batch_scores([ex.query for ex in examples]))
    return RetrievalData(queries, functions, [everything] * len(examples), positives, lexical=scores, sentence_queries=sentence_queries)


def train_library_retriever(
    directory: Path, encoder: SoftTokenEncoder, library_path: str | Path, train: Sequence[Example], val: Sequence[Example],
    options: dict, seed: int,
) -> tuple[Retriever, dict]:
    """Retriever for a library in per-function mode, saved under `directory` (skipped if there):
    projections trained on most of `train`, the lexical weight fitted on the rest (lexical.FUSION_HOLDOUT),
    thresholds calibrated on `val`."""
    if (directory / MANIFEST).is_file():
        retriever = Retriever.load(directory)
        return retriever, retriever.meta.get("metrics", {})
    library = load_library(library_path)
    train, val = in_library(train, library), in_library(val, library)
    fit_ids, holdout_ids = fusion_split(len(train), seed)
    fit, holdout = [train[i] for i in fit_ids], [train[i] for i in holdout_ids]
    if not fit or not val:
        raise InputError(f"{library_path}: too few training examples call only its tools ({len(train)} train, {len(val)} validation)")
    functions = library_embeddings(encoder, library)
    lexical = LexicalIndex(library)
    requests = directory.parent / "library-requests"

    def data(examples: Sequence[Example], scoring: bool = True) -> RetrievalData:
        """`scoring`: per-sentence queries and lexical scores, as the retriever scores a request;
        else the whole-request soft tokens the projections are trained on."""
        tokens = request_tokens(encoder, examples, requests)
        if not scoring:
            return library_retrieval_data(tokens, functions, examples, library)
        per_sentence = request_sentence_tokens(encoder, examples, directory.parent / "library-sentences")
        return library_retrieval_data(tokens, functions, examples, library, lexical, per_sentence)

    # Every example's candidates are the whole library, so each step projects all of it: larger
    # batches (fewer steps) keep an epoch cheap. No refusal head: every example here calls a tool.
    retriever, training = new_retriever(
        functions.shape[1], {"batch_size": 128, **options, "refusal_head": False, "per_sentence": True}, seed
    )
    history = train_retriever(retriever, data(fit, scoring=False), seed=seed, **training)  # trains the cosine only
    val_data = data(val)
    metrics = {
        "loss_history": history,
        "lexical_fit": fit_lexical_weight(retriever, data(holdout)),
        "calibration": calibrate(retriever, val_data),
        "validation": evaluate(retriever, val_data),
        "train_examples": len(fit),
        "holdout_examples": len(holdout),
        "validation_examples": len(val),
    }
    digest = hashlib.sha256("\n".join(map(tool_line, library)).encode()).hexdigest()
    retriever.save(directory, meta={"metrics": metrics, "library": {"path": str(library_path), "tools": len(library), "sha256": digest}})
    return retriever, metrics


@dataclass
class LibraryScores:
    """One request scored against a per-function library: the parts and the fused score."""

    queries: torch.Tensor  # (H,) the request's soft token, or (S, H) one per sentence
    cosine: torch.Tensor  # (n,) or (S, n)
    lexical: torch.Tensor | None  # BM25 in [0, 1], (n,) or (S, n); None without a lexical weight
    fused: torch.Tensor  # (n,) what the retriever selects from
    timings: dict[str, float]  # "sentences" (the extra large-model pass), "cosine", "lexical", "fuse"


@dataclass
class PerFunctionLibrary:
    """A library too large for one prompt: per-function embeddings and a lexical index, built once.

    `score` is how the cascade serves it and what the retrieval benchmark measures."""

    tools: list[Tool]
    embeddings: torch.Tensor  # (n_tools, H) per-function embeddings
    lexical: LexicalIndex
    _projected: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # per retriever

    @classmethod
    def build(cls, encoder: SoftTokenEncoder, tools: Sequence[Tool], disk_cache_bytes: int = DISK_CACHE_BYTES) -> PerFunctionLibrary:
        """`disk_cache_bytes`: the bound of the embeddings' cache on disk (see `library_embeddings`)."""
        tools = list(tools)
        return cls(tools, library_embeddings(encoder, tools, disk_cache_bytes), LexicalIndex(tools))

    @torch.no_grad()
    def score(self, encoder: SoftTokenEncoder, retriever: Retriever, request: str, soft_token: torch.Tensor) -> LibraryScores:
        """A per-sentence retriever queries with each sentence's soft token and BM25 scores, and a
        tool scores by its best sentence; otherwise the request's soft token and its BM25 scores."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        queries = sentence_queries(encoder, request, soft_token) if retriever.config.per_sentence else soft_token
        timings["sentences"] = time.perf_counter() - start
        start = time.perf_counter()
        if id(retriever) not in self._projected:  # the library side is projected once per retriever
            self._projected[id(retriever)] = retriever.eval().project_functions(self.embeddings)
        cosine = retriever.eval().project_queries(queries) @ self._projected[id(retriever)].T
        timings["cosine"] = time.perf_counter() - start
        start = time.perf_counter()
        lexical = None
        if retriever.config.lexical_weight:
            rows = self.lexical.sentence_scores(request)
            lexical = rows if retriever.config.per_sentence else rows.max(0).values
        timings["lexical"] = time.perf_counter() - start
        start = time.perf_counter()
        fused = retriever.fuse(cosine, lexical)
        timings["fuse"] = time.perf_counter() - start
        return LibraryScores(queries, cosine, lexical, fused, timings)
