"""Retrieval at scale (`hyfunc bench retriever`): a trained retriever against a whole tool library
read in per-function mode (see cascade/library.py; the library embeddings are cached).

Per request only the soft token is computed (instruction + request, no tools); the timed part is
what a server does per query against the cached library: project the soft token, one matrix-vector
product, the request's lexical (BM25) scores where the retriever fuses them, top-k. Requests come
from held-out fc-train examples whose gold tools are all in the library.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from hyfunc.cascade.data import Example, load_examples, split_examples
from hyfunc.cascade.library import PerFunctionLibrary, in_library
from hyfunc.cascade.retriever import Retriever, recall_at_k
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.eval.plots import pyplot
from hyfunc.eval.provenance import provenance, provenance_markdown
from hyfunc.formats.schema import Tool


def library_requests(data: Sequence[str], library: list[Tool], limit: int | None = None) -> list[Example]:
    """Held-out examples (the validation side of `hyfunc prepare`'s split, never trained on) that
    call tools, all of whose gold tools are in the library (by name)."""
    _, held_out = split_examples(load_examples(data))
    chosen = in_library(held_out, library)
    return chosen[:limit] if limit else chosen


@torch.no_grad()
def run_retrieval_benchmark(
    encoder: SoftTokenEncoder, retrievers: dict[str, Retriever], library: list[Tool], requests: list[Example], ks=(1, 3, 5),
    method=None,
) -> dict:
    """Recall@k and per-query search time of each retriever, on the same soft tokens.

    A retriever with a lexical weight is also scored without it ("cosine only"), and the lexical
    scores are scored alone ("lexical only"), so the report shows what each part contributes. A
    per-sentence retriever (library.py) queries with one soft token per sentence, timed apart.
    `method`: the cascade the retrievers belong to, recorded in the provenance."""
    indexed = PerFunctionLibrary.build(encoder, library)
    index = {t.name: i for i, t in enumerate(library)}
    top = min(max(ks), len(library))
    gold, soft_ms, sentence_ms = [], [], []
    ranked: dict[str, list[list[int]]] = {}
    search_ms: dict[str, list[float]] = {}

    def record(name: str, scores: torch.Tensor, seconds: float) -> None:
        ranked.setdefault(name, []).append(torch.topk(scores, top).indices.tolist())
        search_ms.setdefault(name, []).append(1000 * seconds)

    for ex in tqdm(requests, desc="library queries", unit="req"):
        start = time.perf_counter()
        soft = encoder.encode_request(ex.query).soft_token
        soft_ms.append(1000 * (time.perf_counter() - start))
        gold.append(sorted({index[c.name] for c in ex.answers}))
        sentences_timed = lexical_done = False
        for name, retriever in retrievers.items():
            # The serving path (what the cascade runs for a library), with its parts scored apart.
            scored = indexed.score(encoder, retriever, ex.query, soft)
            t = scored.timings
            if retriever.config.per_sentence and len(scored.queries) > 1 and not sentences_timed:
                sentence_ms.append(1000 * t["sentences"])  # a one-sentence request reuses its soft token
                sentences_timed = True
            if scored.lexical is not None:
                record(f"{name}, cosine only", retriever.fuse(scored.cosine, None), t["cosine"])
                if not lexical_done:
                    lexical = scored.lexical if scored.lexical.dim() == 1 else scored.lexical.max(0).values
                    record("lexical only (BM25 per sentence)", lexical, t["lexical"])
                    lexical_done = True
            record(name, scored.fused, t["cosine"] + t["lexical"] + t["fuse"])
    return {
        "library_tools": len(library),
        "requests": len(requests),
        "soft_token_ms_median": statistics.median(soft_ms),
        # Over the requests of more than one sentence, for per-sentence retrievers: their extra passes.
        "sentence_tokens_ms_median": statistics.median(sentence_ms) if sentence_ms else None,
        "multi_sentence_requests": len(sentence_ms),
        "lexical_weights": {name: r.config.lexical_weight for name, r in retrievers.items()},
        "retrievers": {
            name: {
                **{f"recall@{k}": recall_at_k(ranked[name], gold, k) for k in ks},
                "search_ms_median": statistics.median(search_ms[name]),
                "search_ms_p90": sorted(search_ms[name])[int(0.9 * (len(search_ms[name]) - 1))],
            }
            for name in ranked
        },
        "command": list(sys.argv),
        "provenance": provenance([method] if method is not None else []),
    }


def write_retrieval_report(result: dict, out_dir: str | Path, ks=(1, 3, 5)) -> dict[str, Path]:
    """retrieval.json, retrieval.md (a table per retriever) and retrieval.png (recall@k bars)."""
    plt = pyplot()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "retrieval.json", "md": out / "retrieval.md", "png": out / "retrieval.png"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    lines = [
        f"# Retrieval over a library of {result['library_tools']} tools (per-function mode)", "",
        f"Command: `{' '.join(result['command'])}`", "",
        provenance_markdown(result.get("provenance")), "",
        f"{result['requests']} held-out fc-train requests whose gold tools are all in the library. "
        f"Soft token of [instruction + request]: median {result['soft_token_ms_median']:.0f} ms (large model)"
        + (f"; per-sentence retrievers also run one [instruction + sentence] pass per sentence on the "
           f"{result['multi_sentence_requests']} requests of several sentences: median {result['sentence_tokens_ms_median']:.0f} ms more"
           if result.get("sentence_tokens_ms_median") else "")
        + ". Search = project the soft token(s), one product with the projected library, the request's BM25 "
        "scores (fused retrievers; per sentence: a tool scores by its best sentence), top-k. Lexical weights: "
        + ", ".join(f"{name}: {w:g}" for name, w in result["lexical_weights"].items()) + ".", "",
        "| retriever | " + " | ".join(f"recall@{k} %" for k in ks) + " | search ms (median) | search ms (p90) |",
        "|---|" + "---:|" * (len(ks) + 2),
    ]
    for name, m in result["retrievers"].items():
        recalls = " | ".join(f"{100 * m[f'recall@{k}']:.1f}" for k in ks)
        lines.append(f"| {name} | {recalls} | {m['search_ms_median']:.2f} | {m['search_ms_p90']:.2f} |")
    paths["md"].write_text("\n".join(lines) + "\n", encoding="utf-8")

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(result["retrievers"])
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        values = [100 * result["retrievers"][name][f"recall@{k}"] for k in ks]
        ax.bar([i + j * width for i in range(len(ks))], values, width, label=name)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(ks))], [f"recall@{k}" for k in ks])
    ax.set_ylabel("% of gold tools retrieved")
    ax.set_ylim(0, 100)
    ax.set_title(f"{result['library_tools']}-tool library, {result['requests']} requests")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(paths["png"], dpi=120)
    plt.close(fig)
    return paths
