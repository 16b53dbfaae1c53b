"""Lexical (BM25) scores of a request against a tool library, fused with the retriever's cosine.

Over a library of thousands of tools read in per-function mode, the soft token of [instruction +
request] alone finds the gold tools poorly: it is the state that decodes the first answer token,
one vector, while a library request often asks for three unrelated tools in three sentences
("check the warehouse capacity ... then get the library layout ... finally ..."). Requests also
tend to name what they want in the tools' own words. So a retriever ranks by

    cosine(projected soft token, projected tool) + lexical_weight * lexical(request, tool)

where lexical is, over the request's sentences, the best BM25 score of the tool divided by that
sentence's best score: every sentence's best tools score 1, whichever sentence asks for them.
`lexical_weight` is fitted on requests the projections were not trained on (`fit_lexical_weight`).
The joint retriever (short tool lists shown in one prompt) uses the same fusion: on fc-train
validation its exact tool sets rose from 48 % to 78 %.
"""
from __future__ import annotations

import random
import re
from typing import Sequence

import bm25s
import numpy as np
import torch

from hyfunc.cascade.retriever import (
    RetrievalData,
    Retriever,
    example_cosines,
    fuse_examples,
    recall_at_k,
)
from hyfunc.formats.schema import Tool

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SEPARATORS = re.compile(r"[_\-./]")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")
MIN_SENTENCE_WORDS = 3  # shorter pieces ("Thanks.", "Ok!") ask for no tool of their own
WEIGHT_GRID = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0)


def _words(identifier: str) -> str:
    """getWeatherForecast / get_weather.forecast -> get Weather Forecast: BM25 matches words."""
    return _SEPARATORS.sub(" ", _CAMEL.sub(r"\1 \2", identifier))


def tool_text(tool: Tool) -> str:
    """What a tool is indexed by: its name in words, description, parameter names and descriptions."""
    params = " ".join(f"{_words(name)} {param.description}" for name, param in tool.parameters.items())
    return f"{_words(tool.name)} {tool.description} {params}"


def sentences(request: str) -> list[str]:
    """The request's sentences of at least MIN_SENTENCE_WORDS words (the whole request if none)."""
    parts = [p for p in _SENTENCE_END.split(request.strip()) if len(p.split()) >= MIN_SENTENCE_WORDS]
    return parts or [request]


def _tokens(texts: list[str]) -> list[list[str]]:
    # No stemmer: on fc-train requests against the 4,076-tool library stemming did not help recall.
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class LexicalIndex:
    """BM25 (bm25s) over the tools' text; built in about a second for thousands of tools."""

    def __init__(self, tools: Sequence[Tool]):
        if not tools:
            raise ValueError("a lexical index needs at least one tool")
        self.size = len(tools)
        self._bm25 = bm25s.BM25()
        self._bm25.index(_tokens([tool_text(t) for t in tools]), show_progress=False)

    def sentence_scores(self, request: str) -> torch.Tensor:
        """(n_sentences, n_tools) in [0, 1], one row per `sentences(request)`: BM25 / that sentence's
        best (a row of 0: no word matches, or stopwords only: "What is it?", which bm25s rejects)."""
        parts = sentences(request)
        rows = np.zeros((len(parts), self.size), dtype=np.float32)
        for row, words in zip(rows, _tokens(parts)):
            raw = self._bm25.get_scores(words) if words else np.zeros(0)
            if raw.size and raw.max() > 0:
                row[:] = raw / raw.max()
        return torch.from_numpy(rows)

    def scores(self, request: str) -> torch.Tensor:
        """(n_tools,) in [0, 1]: the max over sentences of `sentence_scores`."""
        return self.sentence_scores(request).max(0).values

    def batch_scores(self, requests: Sequence[str]) -> torch.Tensor:
        """(n_requests, n_tools), one row per request as `scores` gives it."""
        return torch.stack([self.scores(r) for r in requests]) if requests else torch.empty(0, self.size)


def lexical_scores(request: str, tools: Sequence[Tool]) -> torch.Tensor:
    """`LexicalIndex(tools).scores(request)`, for a tool list seen once (an empty list: no scores)."""
    return LexicalIndex(tools).scores(request) if tools else torch.empty(0)


#: Share of the training examples held out of the projections' training to fit the lexical weight.
FUSION_HOLDOUT = 0.15


def fusion_split(n: int, seed: int) -> tuple[list[int], list[int]]:
    """Indices (projections' training, lexical-weight fit) of n training examples, seeded."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    cut = n - max(1, int(FUSION_HOLDOUT * n))
    return sorted(order[:cut]), sorted(order[cut:])


def fit_lexical_weight(retriever: Retriever, data: RetrievalData, k: int | None = 5, grid: Sequence[float] = WEIGHT_GRID) -> dict[str, float]:
    """Set `retriever.config.lexical_weight` to the grid value with the best recall@k on `data`
    (a RetrievalData with `lexical` scores, not used to train the projections); k=None ranks
    each example's gold tools into its top |gold| (R-precision: what the selection rule needs
    when the offered list is short). Returns the value of every weight tried, 0 (cosine only) included."""
    if data.lexical is None:
        raise ValueError("fitting the lexical weight needs data with lexical scores")
    gold = [[cand.index(p) for p in pos] for cand, pos in zip(data.candidates, data.positives)]
    if not any(gold):  # nothing to rank (e.g. a tiny split of refusals only): cosine only
        retriever.config.lexical_weight = 0.0
        return {"lexical_weight": 0.0}
    metric = f"recall@{k}" if k else "R-precision"
    cosines = example_cosines(retriever, data)  # the projections do not depend on the weight
    values = {}
    for weight in (0.0, *grid):
        retriever.config.lexical_weight = weight
        scores = fuse_examples(retriever, data, cosines)
        if k:
            values[weight] = recall_at_k([torch.topk(s, min(k, len(s))).indices.tolist() for s in scores], gold, k)
        else:
            values[weight] = float(np.mean([
                len(set(torch.topk(s, len(g)).indices.tolist()) & set(g)) / len(g) for s, g in zip(scores, gold) if g
            ]))
    retriever.config.lexical_weight = max(values, key=lambda w: (values[w], -w))  # ties: the smaller weight
    return {f"{metric} at weight {w:g}": v for w, v in values.items()} | {"lexical_weight": retriever.config.lexical_weight}
