"""`hyfunc bench small-retrieval`: the small path's tool selector (MiniLM + BM25, no large model)
against the cascade's retriever (the large model's soft token + BM25), on the same held-out
fc-train requests and the same offered tool lists.

Requests: fc-train's validation split (`hyfunc prepare` holds it out of training; both the
cascade's retriever and the selector fitted their lexical weight and thresholds on it) plus the
refusal examples made from it (augment_refusals: a request shown its list without its gold tools,
or another request's tools), as both were calibrated. Per selector: recall@k over requests with
a call, the exact tool set chosen, refusals on the no-call ones, and the time per request (the
cascade's includes its large-model pass, the selector's the MiniLM embedding of the request;
tool vectors are cached, as a server has them).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from hyfunc.cascade.data import Example, augment_refusals, load_examples, split_examples
from hyfunc.cascade.lexical import lexical_scores
from hyfunc.cascade.retriever import exact_set_accuracy, recall_at_k, refusal_accuracy
from hyfunc.cascade.selector import ToolSelector

KS = (1, 3, 5)
#: (request, tools) -> (scores of the tools, the tools selected); what each compared selector does.
Ranker = Callable[[Example], tuple[torch.Tensor, list[int]]]


def held_out_requests(data: Sequence[str], limit: int | None = None, refusal_fraction: float = 0.15,
                      seed: int = 0) -> list[Example]:
    """Validation-split examples with tools, plus refusal examples made from them; the first
    `limit` of each kind in proportion (a quick run keeps both)."""
    _, val = split_examples(load_examples(list(data)))
    val = [ex for ex in val if ex.tools]
    if limit is not None:
        val = val[:limit]
    augmented = augment_refusals(val, refusal_fraction, seed + 1)
    return augmented


def cascade_ranker(cascade: Any) -> Ranker:
    """The cascade's own selection (as HyFuncMethod.answer runs it on a short tool list)."""
    retriever, encoder = cascade.retriever, cascade.encoder

    def rank(ex: Example) -> tuple[torch.Tensor, list[int]]:
        encoding = encoder.encode(ex.query, ex.tools)
        with torch.no_grad():
            cosine = retriever.scores(encoding.soft_token, encoding.function_embeddings)
        lexical = lexical_scores(ex.query, ex.tools) if retriever.config.lexical_weight else None
        scores = retriever.fuse(cosine, lexical)
        answerable = float(retriever.answerability(encoding.soft_token, [cosine]))
        return scores, retriever.select_from_scores(scores, answerable)

    return rank


def selector_ranker(selector: ToolSelector) -> Ranker:
    def rank(ex: Example) -> tuple[torch.Tensor, list[int]]:
        scores, answerable = selector.rank(ex.query, ex.tools)
        return scores, selector.retriever.select_from_scores(scores, answerable)

    return rank


def run_small_retrieval(rankers: dict[str, Ranker], requests: Sequence[Example]) -> dict[str, Any]:
    """Every ranker on every request, interleaved (one request at a time through all of them, so
    load on the machine affects them alike)."""
    gold = [[i for i, t in enumerate(ex.tools) if t.name in {c.name for c in ex.answers}] for ex in requests]
    ranked: dict[str, list[list[int]]] = {name: [] for name in rankers}
    selected: dict[str, list[list[int]]] = {name: [] for name in rankers}
    ms: dict[str, list[float]] = {name: [] for name in rankers}
    for ex in tqdm(requests, desc="small-path retrieval", unit="req"):
        for name, rank in rankers.items():
            start = time.perf_counter()
            scores, chosen = rank(ex)
            ms[name].append(1000 * (time.perf_counter() - start))
            ranked[name].append(torch.argsort(scores, descending=True, stable=True).tolist())
            selected[name].append(chosen)
    with_call = sum(bool(g) for g in gold)
    return {
        "requests": len(requests), "with_call": with_call, "without_call": len(requests) - with_call,
        "selectors": {
            name: {
                **{f"recall@{k}": recall_at_k(ranked[name], gold, k) for k in KS},
                "exact_set_accuracy": exact_set_accuracy(selected[name], gold),
                "refusal_accuracy": refusal_accuracy(selected[name], gold),
                "ms_median": statistics.median(ms[name]) if ms[name] else float("nan"),
                "ms_p90": sorted(ms[name])[int(0.9 * (len(ms[name]) - 1))] if ms[name] else float("nan"),
            }
            for name in rankers
        },
        "command": list(sys.argv),
    }


def write_small_retrieval_report(result: dict, out_dir: str | Path) -> dict[str, Path]:
    """small_retrieval.json and small_retrieval.md (one row per selector)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "small_retrieval.json", "md": out / "small_retrieval.md"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# Tool selection without the large model (small path) vs the cascade's retriever", "",
        f"Command: `{' '.join(result['command'])}`", "",
        f"{result['requests']} held-out fc-train requests (validation split): {result['with_call']} with a call, "
        f"{result['without_call']} refusal examples made from them. Time per request: the cascade's includes its "
        "large-model pass; the selector's, the MiniLM embedding of the request (tool vectors cached).", "",
        "| selector | " + " | ".join(f"recall@{k} %" for k in KS) + " | exact set % | refusals % | ms (median) | ms (p90) |",
        "|---|" + "---:|" * (len(KS) + 4),
    ]
    for name, m in result["selectors"].items():
        cells = [f"{100 * m[f'recall@{k}']:.1f}" for k in KS]
        cells += [f"{100 * m['exact_set_accuracy']:.1f}", f"{100 * m['refusal_accuracy']:.1f}",
                  f"{m['ms_median']:.1f}", f"{m['ms_p90']:.1f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    paths["md"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths

