"""Soft-token function retriever: two projections, cosine similarity, InfoNCE, a calibrated rule.

Training data are precomputed embeddings (see soft_token.py): one soft token per example, the
embeddings of that example's candidate tools, and which candidates the gold answer calls.

Loss: for each (soft token, gold function) pair, InfoNCE over the positive plus negatives made of
(a) the example's other candidate tools (hard negatives: same domain, shown to the same prompt)
and (b) every candidate of the other examples in the batch. The example's other gold functions
are left out of the denominator (they are not negatives), and so is any column whose `key` (tool
identity, e.g. its JSON text) equals one of the example's gold tools: the same tool shown in
another example is not a negative either.

Selection rule over the offered functions; score = cosine similarity plus, with a lexical weight,
a weighted lexical score of the request (lexical.py):
- answerability < refusal_threshold     -> []  ("no tool fits")
- otherwise the functions with score >= threshold, best first, at most top_k; at least the best one.
Answerability is the logit of the refusal head where one is trained (`refusal_head`: a linear
"does a tool fit?" classifier on the soft token, the large model's state just before it would
answer, trained on the examples with and without a call), else the best cosine. Never the lexical
part: it says which offered tool a request's words name, not whether any fits (normalised per
sentence, some tool scores 1 whenever a word matches).
Both thresholds are chosen on a validation split (see `calibrate`): the refusal threshold for the
balanced accuracy of refusing, the keep threshold for exact-set accuracy of the calls. Once the
small model is trained, `hyfunc prepare` re-chooses the keep threshold by that model's calls
(prepare.calibrate_keep_threshold): a dropped tool costs the cascade more than an extra one.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from hyfunc.cascade.manifest import read_manifest, write_manifest

WEIGHTS = "retriever.safetensors"
FORMAT = "hyfunc-retriever"
FORMAT_VERSION = 1


@dataclass
class RetrieverConfig:
    query_dim: int  # hidden size of the large model (soft token)
    function_dim: int  # hidden size of the function embeddings (same model: usually = query_dim)
    proj_dim: int = 256
    mlp_hidden: int = 0  # 0: linear projections; > 0: Linear -> GELU -> Linear with this width
    dropout: float = 0.0
    temperature: float = 0.07
    top_k: int = 8  # cap on selected functions (parallel calls need several)
    threshold: float = 0.5  # keep functions at or above this score
    refusal_threshold: float = -1.0  # answerability below this: refuse (-1 on the cosine: never refuse)
    refusal_head: bool = False  # answerability from a trained classifier on the soft token, not the best cosine
    lexical_weight: float = 0.0  # weight of the request's BM25 score added to the cosine (lexical.py)
    per_sentence: bool = False  # query with one soft token per sentence of the request (library.py)


@dataclass
class RetrievalData:
    """Precomputed embeddings for training or calibration.

    `candidates[i]` indexes the rows of `functions` offered to example i (its tool list);
    `positives[i]` is the subset of those rows the gold answer calls (empty: no call).
    `keys[j]` names function row j's tool, so that copies of one tool shown to several examples
    are never used as each other's negatives; None means every row is a different tool.
    """

    queries: torch.Tensor  # (N, query_dim)
    functions: torch.Tensor  # (M, function_dim)
    candidates: list[list[int]]
    positives: list[list[int]]
    keys: list[str] | None = None
    lexical: list[torch.Tensor] | None = None  # per example: BM25 scores of its candidates (lexical.py)
    # Per example, one soft token per sentence of its request (S_i, query_dim): scored instead of
    # `queries` (which training and the refusal head still use); `lexical[i]` is then (S_i, n_i).
    sentence_queries: list[torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if not (len(self.queries) == len(self.candidates) == len(self.positives)):
            raise ValueError("queries, candidates and positives must have one entry per example")
        for i, (cand, pos) in enumerate(zip(self.candidates, self.positives)):
            if not set(pos) <= set(cand):
                raise ValueError(f"example {i}: positives must be among its candidates")
        if self.keys is not None and len(self.keys) != len(self.functions):
            raise ValueError("keys must name every function row")
        if self.lexical is not None and [x.shape[-1] for x in self.lexical] != [len(c) for c in self.candidates]:
            raise ValueError("lexical must score every candidate of every example")
        if self.sentence_queries is not None:
            if len(self.sentence_queries) != len(self.candidates):
                raise ValueError("sentence_queries must have one entry per example")
            if self.lexical is not None and [x.shape[0] if x.dim() == 2 else -1 for x in self.lexical] != [len(q) for q in self.sentence_queries]:
                raise ValueError("with sentence_queries, lexical must score each sentence: (S_i, n_i) per example")

    def __len__(self) -> int:
        return len(self.candidates)

    def subset(self, indices: Sequence[int]) -> RetrievalData:
        # Function rows are shared, only the example lists are restricted.
        return RetrievalData(
            self.queries[list(indices)], self.functions,
            [self.candidates[i] for i in indices], [self.positives[i] for i in indices], self.keys,
            [self.lexical[i] for i in indices] if self.lexical is not None else None,
            [self.sentence_queries[i] for i in indices] if self.sentence_queries is not None else None,
        )


def _projection(cfg: RetrieverConfig, in_dim: int) -> nn.Module:
    if cfg.mlp_hidden <= 0:
        return nn.Linear(in_dim, cfg.proj_dim)
    return nn.Sequential(
        nn.Linear(in_dim, cfg.mlp_hidden), nn.GELU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.mlp_hidden, cfg.proj_dim)
    )


class Retriever(nn.Module):
    def __init__(self, config: RetrieverConfig):
        super().__init__()
        self.config = config
        self.meta: dict[str, Any] = {}  # provenance read back by `load` (see `save`)
        self.query_proj = _projection(config, config.query_dim)
        self.function_proj = _projection(config, config.function_dim)
        # Per-feature standardisation set from the training data: LLM hidden states have a few
        # huge-magnitude dimensions that would otherwise dominate the first matmul.
        for name, dim in (("query", config.query_dim), ("function", config.function_dim)):
            self.register_buffer(f"{name}_mean", torch.zeros(dim))
            self.register_buffer(f"{name}_std", torch.ones(dim))
        # Logit of "some offered tool fits", on the normalised soft token (see `train_refusal_head`).
        self.refusal = nn.Linear(config.query_dim, 1) if config.refusal_head else None

    def set_normalization(self, queries: torch.Tensor, functions: torch.Tensor) -> None:
        for name, x in (("query", queries), ("function", functions)):
            x = x.float()
            getattr(self, f"{name}_mean").copy_(x.mean(0))
            getattr(self, f"{name}_std").copy_(x.std(0, unbiased=False).clamp_min(1e-6) if len(x) > 1 else torch.ones(x.shape[1]))

    # -- scoring ---------------------------------------------------------------------------
    def project_queries(self, q: torch.Tensor) -> torch.Tensor:
        """(..., query_dim) -> unit vectors (..., proj_dim)."""
        q = (q.float() - self.query_mean) / self.query_std
        return F.normalize(self.query_proj(q), dim=-1)

    def project_functions(self, f: torch.Tensor) -> torch.Tensor:
        """(..., function_dim) -> unit vectors; cache these for a fixed library."""
        f = (f.float() - self.function_mean) / self.function_std
        return F.normalize(self.function_proj(f), dim=-1)

    @torch.no_grad()
    def scores(self, query_vec: torch.Tensor, function_vecs: torch.Tensor, lexical: torch.Tensor | None = None) -> torch.Tensor:
        """Scores (n,) of one soft token against each function embedding: the cosine similarity,
        plus lexical_weight times `lexical` (the request's BM25 scores of those functions) if given.
        A (S, query_dim) query (one soft token per sentence) gives (S, n) cosines, or with `lexical`
        (S, n) the fused scores of `fuse`."""
        was_training = self.training
        self.eval()
        out = self.project_queries(query_vec) @ self.project_functions(function_vecs).T
        self.train(was_training)
        return out if lexical is None else self.fuse(out, lexical)

    @torch.no_grad()
    def answerability(self, query_vecs: torch.Tensor, cosines: Sequence[torch.Tensor]) -> torch.Tensor:
        """(N,) how well some offered tool fits each request (refused below refusal_threshold): the
        refusal head's logit if there is one, else the best cosine (-inf with nothing offered).
        `query_vecs` (N, query_dim) are soft tokens, `cosines[i]` request i's cosines."""
        if self.refusal is not None:
            return self.refusal((query_vecs.float().reshape(-1, self.config.query_dim) - self.query_mean) / self.query_std).squeeze(-1)
        return torch.tensor([float(c.max()) if c.numel() else -math.inf for c in cosines])

    def fuse(self, cosine: torch.Tensor, lexical: torch.Tensor | None) -> torch.Tensor:
        """cosine + lexical_weight * lexical, (n,). Per sentence ((S, n) each: a sentence's soft token
        and its own BM25 scores), a tool scores by the sentence that asks for it best."""
        fused = cosine if lexical is None or self.config.lexical_weight == 0 else cosine + self.config.lexical_weight * lexical.to(cosine.dtype)
        return fused.max(0).values if fused.dim() == 2 else fused

    def select(self, query_vec: torch.Tensor, function_vecs: torch.Tensor, lexical: torch.Tensor | None = None) -> list[int]:
        """Indices of the functions to offer, best first; [] means refuse."""
        cosine = self.scores(query_vec, function_vecs)
        return self.select_from_scores(self.fuse(cosine, lexical), float(self.answerability(query_vec, [cosine])))

    def select_from_scores(self, scores: torch.Tensor | Sequence[float], answerability: float | None = None) -> list[int]:
        """The rule on precomputed scores and answerability (default: the best score)."""
        return select_indices(scores, self.config.threshold, self.config.refusal_threshold, self.config.top_k, answerability)

    # -- persistence: a directory = manifest.json + retriever.safetensors ---------------------
    def save(self, directory: str | Path, meta: dict[str, Any] | None = None) -> Path:
        """`meta` records what the embeddings came from (model, instruction, mode) for checks at load."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS))
        manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "weights": WEIGHTS,
            "config": asdict(self.config), "meta": meta or {},
        }
        return write_manifest(directory, manifest)

    @classmethod
    def load(cls, directory: str | Path) -> Retriever:
        directory = Path(directory)
        manifest = read_manifest(directory, FORMAT, FORMAT_VERSION, "retriever")
        model = cls(RetrieverConfig(**manifest["config"]))
        model.load_state_dict(load_file(str(directory / manifest["weights"])))
        model.meta = manifest.get("meta", {})
        return model.eval()


def select_indices(
    scores: torch.Tensor | Sequence[float], threshold: float, refusal_threshold: float, top_k: int,
    answerability: float | None = None,
) -> list[int]:
    s = torch.as_tensor(scores, dtype=torch.float32).flatten()
    if len(s) == 0 or (float(s.max()) if answerability is None else answerability) < refusal_threshold:
        return []
    order = torch.argsort(s, descending=True, stable=True).tolist()
    keep = [i for i in order[:top_k] if float(s[i]) >= threshold]
    return keep or order[:1]


# ---------------------------------------------------------------------------------------------
# training


def info_nce_loss(model: Retriever, data: RetrievalData, batch: Sequence[int]) -> torch.Tensor | None:
    """Mean InfoNCE over the (example, gold function) pairs of `batch`; None if it has no pair."""
    columns = sorted({j for i in batch for j in data.candidates[i]})
    col_of = {j: c for c, j in enumerate(columns)}
    key_id: dict = {}
    col_keys = torch.tensor([key_id.setdefault(data.keys[j] if data.keys is not None else j, len(key_id)) for j in columns])
    rows, targets, masks = [], [], []
    for r, i in enumerate(batch):
        if not data.positives[i]:
            continue
        gold_keys = torch.tensor([key_id[data.keys[j] if data.keys is not None else j] for j in data.positives[i]])
        allowed = ~torch.isin(col_keys, gold_keys)  # vectorised: a library makes every row thousands of columns wide
        for p in data.positives[i]:
            # Allowed: the positive itself and every column that is not one of this example's gold tools.
            mask = allowed.clone()
            mask[col_of[p]] = True
            masks.append(mask)
            rows.append(r)
            targets.append(col_of[p])
    if not rows:
        return None
    zq = model.project_queries(data.queries[list(batch)])
    zf = model.project_functions(data.functions[columns])
    logits = (zq @ zf.T)[rows] / model.config.temperature
    logits = logits.masked_fill(~torch.stack(masks), float("-inf"))
    return F.cross_entropy(logits, torch.tensor(targets))


TRAINING_OPTIONS = ("epochs", "batch_size", "lr", "weight_decay")


def new_retriever(hidden: int, options: dict, seed: int = 0) -> tuple[Retriever, dict]:
    """(untrained retriever, `train_retriever` keyword arguments) from one options dict that mixes
    RetrieverConfig fields and training settings (TRAINING_OPTIONS)."""
    training = {k: v for k, v in options.items() if k in TRAINING_OPTIONS}
    config = RetrieverConfig(query_dim=hidden, function_dim=hidden, **{k: v for k, v in options.items() if k not in training})
    # Seeded here, not only in training: the initial weights would otherwise depend on whatever
    # drew random numbers earlier in the process, and so would the trained retriever.
    torch.manual_seed(seed)
    return Retriever(config), training


def train_retriever(
    model: Retriever,
    data: RetrievalData,
    epochs: int = 20,
    batch_size: int = 32,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
) -> list[float]:
    """AdamW on InfoNCE; returns the mean loss of each epoch. Sets input normalisation first and
    trains the refusal head last (if the config has one)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    used = sorted({j for cand in data.candidates for j in cand})
    model.set_normalization(data.queries, data.functions[used])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    order = [i for i in range(len(data)) if data.positives[i]]  # no-call examples carry no InfoNCE pair
    history = []
    model.train()
    for _ in range(epochs):
        rng.shuffle(order)
        total, pairs = 0.0, 0
        for b in range(0, len(order), batch_size):
            batch = order[b : b + batch_size]
            loss = info_nce_loss(model, data, batch)
            if loss is None:
                continue
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            n = sum(len(data.positives[i]) for i in batch)
            total, pairs = total + loss.item() * n, pairs + n
        history.append(total / max(pairs, 1))
    if model.refusal is not None:
        train_refusal_head(model, data)
    model.eval()
    return history


def train_refusal_head(model: Retriever, data: RetrievalData, l2: float = 1e-3) -> None:
    """Fit the refusal head: L2-regularised logistic regression of "the example calls a tool" on
    the normalised soft tokens, both classes weighted equally (no-call examples are the minority),
    solved by L-BFGS from zero (deterministic)."""
    offered = [i for i, cand in enumerate(data.candidates) if cand]  # nothing offered: nothing to decide
    labels = torch.tensor([1.0 if data.positives[i] else 0.0 for i in offered])
    if len(offered) == 0 or labels.min() == labels.max():
        raise ValueError("the refusal head needs training examples both with and without a call")
    x = (data.queries[offered].float() - model.query_mean) / model.query_std
    share = labels.mean()
    weights = torch.where(labels > 0, 0.5 / share, 0.5 / (1 - share))
    head = model.refusal
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    optimizer = torch.optim.LBFGS(head.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logits = head(x).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, labels, weight=weights) + l2 * head.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)


@torch.no_grad()
def example_cosines(model: Retriever, data: RetrievalData) -> list[torch.Tensor]:
    """Cosine of each example's soft token with each of its own candidates ((S_i, n_i) with
    `sentence_queries`: one row per sentence)."""
    model.eval()
    zf = model.project_functions(data.functions)
    if data.sentence_queries is not None:
        return [model.project_queries(q) @ zf[cand].T for q, cand in zip(data.sentence_queries, data.candidates)]
    zq = model.project_queries(data.queries)
    return [zf[cand] @ zq[i] for i, cand in enumerate(data.candidates)]


def fuse_examples(model: Retriever, data: RetrievalData, cosines: list[torch.Tensor]) -> list[torch.Tensor]:
    """`example_cosines` plus the model's weighted lexical scores (where `data` has them)."""
    lexical = data.lexical if data.lexical is not None else [None] * len(data)
    return [model.fuse(c, x) for c, x in zip(cosines, lexical)]


def example_scores(model: Retriever, data: RetrievalData) -> list[torch.Tensor]:
    """Scores (as `Retriever.scores`) of each example's soft token against its own candidates."""
    return fuse_examples(model, data, example_cosines(model, data))


def plateau_middle(values: np.ndarray) -> int:
    # Ties form plateaus; the middle of one is further from the scores that bound it than its edge.
    best = np.nonzero(values == values.max())[0]
    return int(best[len(best) // 2])


def calibrate(model: Retriever, val: RetrievalData, grid_size: int = 201) -> dict[str, float]:
    """Set refusal_threshold and threshold from `val`, as two separate decisions; returns the result.

    - refusal_threshold r (on the answerability): the balanced accuracy of "refuse or not", i.e. the
      mean of the share of no-call examples refused and the share of call examples answered. (Maximising exact-set
      accuracy instead rewards refusing any call example whose selection would not be exact,
      although the small model would still answer many of them right: it over-refused.)
    - threshold t: exact-set accuracy over the call examples (the top-|gold| are the gold tools and
      the rule keeps exactly |gold|).
    """
    cosines = example_cosines(model, val)
    scores = fuse_examples(model, val, cosines)
    k = model.config.top_k
    n = len(scores)
    grid = threshold_grid(torch.cat([s for s in scores if len(s)]).numpy() if n else np.zeros(0), grid_size)
    answerable = model.answerability(val.queries, cosines).numpy() if n else np.zeros(0)  # what refusal looks at
    gold_n = np.zeros(n, dtype=int)
    top_ok = np.zeros(n, dtype=bool)
    counts = np.zeros((n, len(grid)), dtype=int)  # how many candidates score >= t
    for i, (s, cand, pos) in enumerate(zip(scores, val.candidates, val.positives)):
        if len(s) == 0:
            continue
        s = s.numpy()
        order = np.argsort(-s, kind="stable")
        gold = {cand.index(p) for p in pos}
        gold_n[i] = len(gold)
        top_ok[i] = set(order[: len(gold)].tolist()) == gold
        counts[i] = (s[None, :] >= grid[:, None]).sum(1)
    offered = np.array([len(s) > 0 for s in scores], dtype=bool)  # without candidates nothing is decided
    calls, no_calls = offered & (gold_n > 0), offered & (gold_n == 0)
    refusal_grid = threshold_grid(answerable[offered], grid_size)
    answered = answerable[None, :] >= refusal_grid[:, None]  # (R, N): not refused at r
    parts = []
    if no_calls.any():
        parts.append((~answered & no_calls).sum(1) / no_calls.sum())
    if calls.any():
        parts.append((answered & calls).sum(1) / calls.sum())
    r_idx = plateau_middle(np.mean(parts, axis=0)) if parts else 0
    kept = np.clip(counts, 1, k)  # (N, T): how many the rule keeps at threshold t (if not refused)
    right_size = (kept == gold_n[:, None]) & (calls & top_ok)[:, None]  # (N, T)
    t_idx = plateau_middle(right_size.sum(0))
    model.config.refusal_threshold = float(refusal_grid[r_idx])
    model.config.threshold = float(grid[t_idx])
    refused_right = int((~answered[r_idx] & no_calls).sum())
    exact = refused_right + int((answered[r_idx] & right_size[:, t_idx]).sum()) + int((~offered).sum())
    return {
        "threshold": model.config.threshold,
        "refusal_threshold": model.config.refusal_threshold,
        "refusal_balanced_accuracy": float(np.mean([p[r_idx] for p in parts])) if parts else float("nan"),
        "exact_set_accuracy": exact / max(n, 1),
    }


def threshold_grid(values: np.ndarray, size: int) -> np.ndarray:
    """Candidate thresholds for `values`: halfway between their quantiles (thresholds sitting on
    observed scores generalise worse), plus one below and one above everything."""
    # Cosines lie in [-1, 1]; a lexical part can push scores above 1.
    low, high = min(-1.0, float(values.min(initial=-1.0))), max(1.0, float(values.max(initial=1.0)))
    points = np.unique(np.concatenate([np.quantile(values, np.linspace(0, 1, size)) if len(values) else [], [low, high]]))
    return np.concatenate([[low - 1e-6], (points[1:] + points[:-1]) / 2, [high + 1e-6]])


# ---------------------------------------------------------------------------------------------
# metrics: `selected[i]` / `ranked[i]` are candidate positions, `gold[i]` the gold positions


def recall_at_k(ranked: Sequence[Sequence[int]], gold: Sequence[Sequence[int]], k: int) -> float:
    """Mean over examples with a gold call of |top-k ∩ gold| / |gold|."""
    values = [len(set(r[:k]) & set(g)) / len(set(g)) for r, g in zip(ranked, gold) if g]
    return sum(values) / len(values) if values else math.nan


def exact_set_accuracy(selected: Sequence[Sequence[int]], gold: Sequence[Sequence[int]]) -> float:
    """Share of examples whose selection is exactly the gold set ([] for no call)."""
    pairs = list(zip(selected, gold))
    return sum(set(s) == set(g) for s, g in pairs) / len(pairs) if pairs else math.nan


def refusal_accuracy(selected: Sequence[Sequence[int]], gold: Sequence[Sequence[int]]) -> float:
    """Among examples without a gold call, the share with an empty selection."""
    values = [not s for s, g in zip(selected, gold) if not g]
    return sum(values) / len(values) if values else math.nan


def evaluate(model: Retriever, data: RetrievalData, ks: Sequence[int] = (1, 3, 5)) -> dict[str, float]:
    """Recall@k, exact-set accuracy and refusal accuracy of `model` (with its thresholds) on `data`."""
    cosines = example_cosines(model, data)
    scores = fuse_examples(model, data, cosines)
    ranked = [torch.argsort(s, descending=True, stable=True).tolist() for s in scores]
    gold = [[cand.index(p) for p in pos] for cand, pos in zip(data.candidates, data.positives)]
    answerable = model.answerability(data.queries, cosines)
    selected = [model.select_from_scores(s, float(a)) for s, a in zip(scores, answerable)]
    out = {f"recall@{k}": recall_at_k(ranked, gold, k) for k in ks}
    out["exact_set_accuracy"] = exact_set_accuracy(selected, gold)
    out["refusal_accuracy"] = refusal_accuracy(selected, gold)
    return out
