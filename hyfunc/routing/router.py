"""The router: a logistic regression on mined routing features that says whether the small path
can answer a request as the large path would, with a threshold calibrated on held-out traffic.

Calibration follows RouteLLM: scores are computed on a held-out traffic sample (the *latest*
part of the labelled log, so the router is judged on traffic newer than what it learned from),
and the threshold is the lowest score (largest share on the small path) at which the requests it
sends to the small path still keep the target agreement with the large path over the whole sample;
requests left to the large path agree with it by definition. The whole trade-off curve (share vs
agreement and precision) is kept in the manifest.

Files: `router.safetensors` (weight, bias, feature mean and scale) and `router.json` (feature
names, embedder, threshold, calibration, curve, training window).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from safetensors.numpy import load_file, save_file

from hyfunc.durable import durable_replacement, write_durably
from hyfunc.formats.calls import calls_from_records
from hyfunc.formats.grounding import Ungrounded, ungrounded_values
from hyfunc.formats.messages import conversation_text
from hyfunc.routing.features import scalar_features
from hyfunc.routing.store import Query, TrafficStore

ROUTER_FORMAT = 1
PRE_SCALARS = ("request_chars_log", "request_words_log", "turns", "tools_log")  # known before any model runs
SMALL_ANSWER_SCALARS = ("small_calls", "small_refused")  # known once the small path has answered
MIN_EXAMPLES = 20
# A small-first router sends every small-path refusal to the cascade, whatever its score: the small
# path refuses by the selector's best MiniLM cosine, weaker than the cascade's refusal head and
# off-topic gate, which read the large model's state; and the attempt cost the selector alone.
SMALL_REFUSED = "the small path called no tool: the cascade decides refusals"
# An answer that calls one tool several times while the selector left out another that nearly fits
# may be one action repeated where the request asks for two ("buy a musical ticket and a train
# ticket"): the small model only saw the one tool; the cascade's retriever reads the large model's state.
ANOTHER_TOOL = "the small path repeated one tool while another nearly fits: {}"


class RouterError(ValueError):
    pass


@dataclass
class RoutingExample:
    features: dict[str, float]
    embedding: list[float] | None
    simple: bool
    created: float = 0.0


@dataclass(frozen=True)
class TradeoffPoint:
    threshold: float  # route to the small path when score >= threshold
    share: float  # fraction of requests sent to the small path
    agreement: float  # fraction of all requests answered as the large path would
    precision: float  # fraction of small-path requests that are simple (1.0 when none are sent)


def tradeoff_curve(scores: np.ndarray, simple: np.ndarray) -> list[TradeoffPoint]:
    """One point per distinct cut, from sending nothing to sending everything to the small path."""
    n = len(scores)
    if n == 0:
        raise RouterError("no held-out traffic to calibrate on")
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], simple[order].astype(bool)
    wrong = np.cumsum(~y)
    points = [TradeoffPoint(float(np.nextafter(s[0], np.inf)), 0.0, 1.0, 1.0)]
    for k in range(1, n + 1):
        if k < n and s[k] == s[k - 1]:
            continue  # a threshold cannot split equal scores
        points.append(TradeoffPoint(float(s[k - 1]), k / n, float(1.0 - wrong[k - 1] / n), float(1.0 - wrong[k - 1] / k)))
    return points


def choose_threshold(curve: Sequence[TradeoffPoint], target: float, metric: str = "agreement") -> TradeoffPoint:
    """The largest share whose `metric` (agreement or precision) still reaches `target`."""
    if metric not in ("agreement", "precision"):
        raise RouterError(f"metric must be agreement or precision, got {metric!r}")
    feasible = [p for p in curve if getattr(p, metric) >= target - 1e-12]
    return max(feasible, key=lambda p: p.share)  # the empty route (share 0) is always feasible


def _fit_logistic(x: np.ndarray, y: np.ndarray, l2: float, iterations: int = 50) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression by Newton's method (exact, deterministic, and cheap at a
    few hundred features): minimises sum(log-loss) + l2/2 * |w|^2, the bias unpenalised."""
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    penalty = np.full(d + 1, l2)
    penalty[-1] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(xb @ w, -30, 30)))
        grad = xb.T @ (p - y) + penalty * w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w[:-1], float(w[-1])


class Router:
    def __init__(self, weight: np.ndarray, bias: float, mean: np.ndarray, scale: np.ndarray,
                 manifest: dict, embedder: Any = None) -> None:
        self.weight, self.bias, self.mean, self.scale = weight, bias, mean, scale
        self.manifest = manifest
        self.scalars: list[str] = list(manifest["scalars"])
        self.embedder_name: str = manifest["embedder"]
        self.threshold: float = float(manifest["threshold"])
        self._embedder = embedder

    @property
    def needs_small_answer(self) -> bool:
        return any(name in SMALL_ANSWER_SCALARS or name == "small_confidence" for name in self.scalars)

    def _embedder_or_load(self) -> Any:
        if self._embedder is None:
            from hyfunc.models.minilm import MINILM_NAME, MiniLMEmbedder

            if self.embedder_name != MINILM_NAME:
                raise RouterError(f"router uses embedder {self.embedder_name!r}; pass it to Router.load")
            self._embedder = MiniLMEmbedder()
        return self._embedder

    def matrix(self, features: Sequence[dict[str, float]], embeddings: np.ndarray | None) -> np.ndarray:
        try:
            x = np.array([[f[name] for name in self.scalars] for f in features], dtype=np.float64)
        except KeyError as e:
            raise RouterError(f"feature {e.args[0]!r} missing (was the router trained with the small "
                              "path's answer, and none was given?)") from None
        x = x.reshape(len(features), len(self.scalars))
        if self.embedder_name:
            if embeddings is None:
                raise RouterError(f"router needs {self.embedder_name} embeddings")
            x = np.hstack([x, np.asarray(embeddings, dtype=np.float64)])
        return (x - self.mean) / self.scale

    def scores(self, features: Sequence[dict[str, float]], embeddings: np.ndarray | None) -> np.ndarray:
        """P(simple) per request."""
        z = self.matrix(features, embeddings) @ self.weight + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))

    def score(self, messages: Sequence[dict], tools: Sequence[Any], small_calls: Sequence[Any] | None = None,
              small_confidence: float | None = None) -> float:
        features = scalar_features(messages, tools, small_calls, small_confidence)
        embeddings = self._embedder_or_load().embed([conversation_text(messages)]) if self.embedder_name else None
        return float(self.scores([features], embeddings)[0])

    def route(self, messages: Sequence[dict], tools: Sequence[Any], small_calls: Sequence[Any] | None = None,
              small_confidence: float | None = None, gave_up: bool = False, near_fit: Sequence[str] = ()) -> str:
        """"small" when the small path is expected to answer as the large path would, else "large"."""
        return self.decide(messages, tools, small_calls, small_confidence, gave_up, near_fit)[0]

    def decide(self, messages: Sequence[dict], tools: Sequence[Any], small_calls: Sequence[Any] | None = None,
               small_confidence: float | None = None, gave_up: bool = False, near_fit: Sequence[str] = (),
               ) -> tuple[str, float | None, list[str]]:
        """("small" | "large", the score, why it escalated). `gave_up`: the small path stopped below
        `confidence_floor`, so it cannot be "small"; nor can a small-path answer with no call
        (`SMALL_REFUSED`), one that repeats one tool while the tools in `near_fit` (offered, not
        selected) nearly fit (`ANOTHER_TOOL`), or one with a value the request does not give
        (`escalations`). The score is None when the small path's answer alone decided."""
        if gave_up:
            return "large", None, []
        if small_calls is not None and not small_calls:
            return "large", None, [SMALL_REFUSED]
        if near_fit and small_calls and len(small_calls) > 1 and len({c.name for c in calls_from_records(small_calls)}) == 1:
            return "large", None, [ANOTHER_TOOL.format(", ".join(near_fit))]
        escalations = self.escalations(messages, tools, small_calls)
        if escalations:
            return "large", None, [str(e) for e in escalations]
        score = self.score(messages, tools, small_calls, small_confidence)
        return ("small" if score >= self.threshold else "large"), score, []

    @staticmethod
    def escalations(messages: Sequence[dict], tools: Sequence[Any], small_calls: Sequence[Any] | None) -> list[Ungrounded]:
        """Why the small path's answer goes to the large path whatever its score: values the
        request does not give (hyfunc.formats.grounding), which the small model guesses and the
        cascade's large model writes better. A rule, not a feature: fc-train's tools rarely
        describe a form, so traffic like it would not teach the router this."""
        if not small_calls:
            return []
        return ungrounded_values(small_calls, tools, conversation_text(messages))

    def confidence_floor(self, messages: Sequence[dict], tools: Sequence[Any], max_calls: int = 8) -> float:
        """The lowest small-path confidence at which this request could still be routed to the
        small path, whatever else the small path's answer holds (1 to `max_calls` calls): its
        decode may stop as soon as its running minimum falls below (escalated either way), so an
        escalated request does not pay for the whole small decode. 0 when the router does not read
        the confidence or gains nothing from it; inf when nothing is routed to the small path."""
        if "small_confidence" not in self.scalars:
            return 0.0
        if self.threshold >= 1.0:
            return math.inf
        if self.threshold <= 0.0:
            return 0.0
        at = self.scalars.index("small_confidence")
        w_conf = float(self.weight[at])
        if w_conf <= 0:
            return 0.0
        embeddings = self._embedder_or_load().embed([conversation_text(messages)]) if self.embedder_name else None
        base = scalar_features(messages, tools, [None], float(self.mean[at]))  # confidence at its mean: no term
        best = -math.inf
        for calls in {1, max_calls}:  # the score is linear in the call count: an end is the best case
            z = self.matrix([{**base, "small_calls": float(calls)}], embeddings) @ self.weight + self.bias
            best = max(best, float(z[0]))
        needed = math.log(self.threshold / (1.0 - self.threshold))  # the score's logit at the threshold
        floor = float(self.mean[at]) + float(self.scale[at]) * (needed - best) / w_conf
        return max(0.0, floor - 1e-9)  # a hair below: never stop a decode the router would have kept

    def save(self, directory: str | Path) -> Path:
        """Write both files; each is replaced atomically and durably, the manifest last (it names the weights)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {"weight": self.weight.astype(np.float64), "bias": np.array([self.bias]),
                   "mean": self.mean.astype(np.float64), "scale": self.scale.astype(np.float64)}
        with durable_replacement(out / "router.safetensors") as weights:
            save_file(tensors, str(weights))
        write_durably(out / "router.json", json.dumps(self.manifest, indent=2, allow_nan=False))
        return out

    @classmethod
    def load(cls, directory: str | Path, embedder: Any = None) -> "Router":
        path = Path(directory)
        try:
            manifest = json.loads((path / "router.json").read_text())
            tensors = load_file(str(path / "router.safetensors"))
        except (OSError, ValueError) as e:
            raise RouterError(f"cannot read router at {path}: {e}") from None
        if manifest.get("format") != ROUTER_FORMAT:
            raise RouterError(f"router at {path} has format {manifest.get('format')}, expected {ROUTER_FORMAT}")
        # A router on scalar features only (embedder "") reads no embedding: any embedder is fine.
        if embedder is not None and manifest["embedder"] and getattr(embedder, "name", None) != manifest["embedder"]:
            raise RouterError(f"router was trained on {manifest['embedder']} embeddings, "
                              f"not {getattr(embedder, 'name', None)}")
        return cls(tensors["weight"], float(tensors["bias"][0]), tensors["mean"], tensors["scale"], manifest, embedder)


def train_router(examples: Sequence[RoutingExample], *, target: float = 0.99, metric: str = "agreement",
                 holdout: float = 0.3, l2: float = 10.0, use_small_answer: bool = False,
                 embedder: Any = None, embedder_name: str | None = None, window: dict | None = None) -> Router:
    """Fit on the oldest (1 - holdout) of `examples` by time, calibrate on the newest `holdout`."""
    if not 0.0 < target <= 1.0:
        raise RouterError(f"target must be in (0, 1], got {target}")
    if len(examples) < MIN_EXAMPLES:
        raise RouterError(f"only {len(examples)} labelled requests; mine at least {MIN_EXAMPLES} first")
    with_embedding = [e.embedding is not None for e in examples]
    if any(with_embedding) and not all(with_embedding):
        raise RouterError("some labelled requests have embeddings and some not; relabel with one embedder")
    ordered = sorted(examples, key=lambda e: e.created)
    n_hold = max(1, int(round(len(ordered) * holdout)))
    train, held = ordered[:-n_hold], ordered[-n_hold:]
    y = np.array([e.simple for e in train], dtype=np.float64)
    if y.min() == y.max():
        raise RouterError(f"all {len(train)} training requests are {'simple' if y[0] else 'not simple'}; "
                          "nothing to learn a boundary from")
    scalars = list(PRE_SCALARS) + (list(SMALL_ANSWER_SCALARS) if use_small_answer else [])
    if use_small_answer and all("small_confidence" in e.features for e in examples):
        scalars.append("small_confidence")
    name = embedder_name or (getattr(embedder, "name", "") if embedder is not None else "")
    if all(with_embedding) and not name:
        raise RouterError("the labels carry embeddings: name their embedder (embedder_name)")
    if not all(with_embedding):
        name = ""
    manifest: dict[str, Any] = {"format": ROUTER_FORMAT, "scalars": scalars, "embedder": name}
    probe = Router(np.zeros(0), 0.0, np.zeros(0), np.ones(0), {**manifest, "threshold": 0.5})

    def raw(rows: Sequence[RoutingExample]) -> np.ndarray:
        emb = np.array([r.embedding for r in rows]) if name else None
        probe.mean, probe.scale = 0.0, 1.0  # type: ignore[assignment]
        return probe.matrix([r.features for r in rows], emb)

    x = raw(train)
    mean, scale = x.mean(0), x.std(0)
    scale[scale < 1e-8] = 1.0  # a constant feature carries nothing; keep it harmless
    weight, bias = _fit_logistic((x - mean) / scale, y, l2)
    router = Router(weight, bias, mean, scale, {**manifest, "threshold": 0.5}, embedder)
    held_x = raw(held)
    scores = 1.0 / (1.0 + np.exp(-np.clip(((held_x - mean) / scale) @ weight + bias, -30, 30)))
    curve = tradeoff_curve(scores, np.array([e.simple for e in held]))
    chosen = choose_threshold(curve, target, metric)
    step = max(1, len(curve) // 100)
    router.threshold = chosen.threshold
    router.manifest = {
        **manifest, "threshold": chosen.threshold, "target": target, "metric": metric, "l2": l2,
        "calibration": {**asdict(chosen), "n": len(held), "simple_rate": float(np.mean([e.simple for e in held]))},
        "curve": [asdict(p) for p in curve[::step]] + ([asdict(curve[-1])] if (len(curve) - 1) % step else []),
        "trained": {"n": len(train), "simple_rate": float(y.mean()),
                    "since": ordered[0].created, "until": ordered[-1].created, **(window or {})},
        "created": time.time(),
    }
    return router


def train_router_from_store(store: TrafficStore, query: Query = Query(), **options: Any) -> Router:
    """Train on every label in the store matching `query` (see train_router for options)."""
    examples: list[RoutingExample] = []
    embedders: set[str] = set()
    for stored, label in store.iter_labels(query):
        examples.append(RoutingExample(label.features, label.embedding, label.simple, stored.request.created))
        if label.embedding is not None:
            embedders.add(label.embedder)
    if len(embedders) > 1:
        raise RouterError(f"labels come from several embedders ({', '.join(sorted(embedders))}); relabel")
    if embedders and "embedder_name" not in options:
        options["embedder_name"] = embedders.pop()
    return train_router(examples, **options)
