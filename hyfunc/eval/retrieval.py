"""Retrieval at scale (`hyfunc bench retriever`): a trained retriever against a whole tool library
read in per-function mode (see cascade/library.py; the library embeddings are cached).

Per request only the soft token is computed (instruction + request, no tools); the timed part is
what a server does per query against the cached library: project the soft token, one matrix-vector
product, top-k. Requests come from held-out fc-train examples whose gold tools are all in the library.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from hyfunc.cascade.data import Example, load_examples, split_examples
from hyfunc.cascade.library import in_library, library_embeddings
from hyfunc.cascade.retriever import Retriever, recall_at_k
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.formats.schema import Tool


def library_requests(data: Sequence[str], library: list[Tool], limit: int | None = None) -> list[Example]:
    """Held-out examples (the validation side of `hyfunc prepare`'s split, never trained on) that
    call tools, all of whose gold tools are in the library (by name)."""
    _, held_out = split_examples(load_examples(data))
    chosen = in_library(held_out, library)
    return chosen[:limit] if limit else chosen


@torch.no_grad()
def run_retrieval_benchmark(
    encoder: SoftTokenEncoder, retrievers: dict[str, Retriever], library: list[Tool], requests: list[Example], ks=(1, 3, 5)
) -> dict:
    """Recall@k and per-query search time of each retriever, on the same soft tokens."""
    functions = library_embeddings(encoder, library)
    projected = {name: r.project_functions(functions) for name, r in retrievers.items()}  # once per library
    index = {t.name: i for i, t in enumerate(library)}
    gold, soft_ms = [], []
    ranked: dict[str, list[list[int]]] = {name: [] for name in retrievers}
    search_ms: dict[str, list[float]] = {name: [] for name in retrievers}
    for ex in tqdm(requests, desc="library queries", unit="req"):
        start = time.perf_counter()
        soft = encoder.encode_request(ex.query).soft_token
        soft_ms.append(1000 * (time.perf_counter() - start))
        gold.append(sorted({index[c.name] for c in ex.answers}))
        for name, retriever in retrievers.items():
            start = time.perf_counter()
            scores = projected[name] @ retriever.project_queries(soft)
            top = torch.topk(scores, min(max(ks), len(library))).indices.tolist()
            search_ms[name].append(1000 * (time.perf_counter() - start))
            ranked[name].append(top)
    return {
        "library_tools": len(library),
        "requests": len(requests),
        "soft_token_ms_median": statistics.median(soft_ms),
        "retrievers": {
            name: {
                **{f"recall@{k}": recall_at_k(ranked[name], gold, k) for k in ks},
                "search_ms_median": statistics.median(search_ms[name]),
                "search_ms_p90": sorted(search_ms[name])[int(0.9 * (len(search_ms[name]) - 1))],
            }
            for name in retrievers
        },
        "command": list(sys.argv),
    }
