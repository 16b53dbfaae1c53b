"""Retrieval at scale (`hyfunc bench retriever`): a trained retriever against a whole tool library.

The library (e.g. ../shared/data/tool-library, ~4,000 tools) never fits one prompt, so it is read
in per-function mode: each tool embedded in its own [instruction + tool] prompt (causal attention
makes that the embedding it would have as the first tool of a list). Those embeddings are
computed once and cached in shards under ``$HYFUNC_HOME/library-embeddings/<model>-<hash>/``, so an
interrupted run resumes and later runs start at once; the retriever's projection of the whole
library is then one matrix.

Per request only the soft token is computed (instruction + request, no tools); the timed part is
what a server does per query against the cached library: project the soft token, one matrix-vector
product, top-k. Requests come from held-out fc-train examples whose gold tools are all in the library.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from hyfunc.cascade.data import Example, load_examples, split_examples
from hyfunc.cascade.retriever import Retriever, recall_at_k
from hyfunc.cascade.soft_token import SoftTokenEncoder, tool_line
from hyfunc.formats.schema import Tool, parse_tools
from hyfunc.models.registry import hyfunc_home


def load_library(path: str | Path) -> list[Tool]:
    """Tools from a JSON Lines file (one schema per line) or a directory of them."""
    path = Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path}: no .jsonl tool files")
    raw = [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    return parse_tools(raw)


def library_requests(data: Sequence[str], library: list[Tool], limit: int | None = None) -> list[Example]:
    """Held-out examples (the validation side of `hyfunc prepare`'s split, never trained on) that
    call tools, all of whose gold tools are in the library (by name)."""
    names = {t.name for t in library}
    _, held_out = split_examples(load_examples(data))
    chosen = [ex for ex in held_out if ex.answers and all(c.name in names for c in ex.answers)]
    return chosen[:limit] if limit else chosen


def library_embeddings(encoder: SoftTokenEncoder, tools: list[Tool], shard_size: int = 256) -> torch.Tensor:
    """(n_tools, H) per-function embeddings, cached in shards keyed by model, instruction and tools."""
    digest = hashlib.sha256("\n".join([encoder.backend.name, encoder.instruction, *map(tool_line, tools)]).encode()).hexdigest()
    directory = hyfunc_home() / "library-embeddings" / f"{encoder.backend.name.replace('/', '_')}-{digest[:16]}"
    directory.mkdir(parents=True, exist_ok=True)
    parts = []
    with tqdm(total=len(tools), desc="library embeddings", unit="tool") as bar:
        for number, start in enumerate(range(0, len(tools), shard_size)):
            path = directory / f"{number:05d}.safetensors"
            chunk = tools[start : start + shard_size]
            if not path.is_file():
                tmp = path.with_suffix(".tmp")
                save_file({"functions": encoder.embed_functions(chunk)}, str(tmp))
                tmp.replace(path)  # a shard is there whole or not at all
            parts.append(load_file(str(path))["functions"])
            bar.update(len(chunk))
    return torch.cat(parts)


@torch.no_grad()
def run_retrieval_benchmark(
    encoder: SoftTokenEncoder, retriever: Retriever, library: list[Tool], requests: list[Example], ks=(1, 3, 5)
) -> dict:
    functions = library_embeddings(encoder, library)
    projected = retriever.project_functions(functions)  # once per library
    index = {t.name: i for i, t in enumerate(library)}
    ranked, gold, search_ms, soft_ms = [], [], [], []
    for ex in tqdm(requests, desc="library queries", unit="req"):
        start = time.perf_counter()
        soft = encoder.encode_request(ex.query)
        soft_ms.append(1000 * (time.perf_counter() - start))
        start = time.perf_counter()
        scores = projected @ retriever.project_queries(soft)
        top = torch.topk(scores, max(ks)).indices.tolist()
        search_ms.append(1000 * (time.perf_counter() - start))
        ranked.append(top)
        gold.append(sorted({index[c.name] for c in ex.answers}))
    return {
        "library_tools": len(library),
        "requests": len(requests),
        **{f"recall@{k}": recall_at_k(ranked, gold, k) for k in ks},
        "search_ms_median": statistics.median(search_ms),
        "search_ms_p90": sorted(search_ms)[int(0.9 * (len(search_ms) - 1))],
        "soft_token_ms_median": statistics.median(soft_ms),
        "command": list(sys.argv),
    }
