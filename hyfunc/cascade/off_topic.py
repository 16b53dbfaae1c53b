"""The off-topic gate: small talk and general questions next to tools are refused, not forced into a call.

The retriever's refusal head decides "no offered tool fits" from the soft token. It learned that
from tool requests shown the wrong tools, so "Tell me a joke." next to everyday tools was answered
with a call. Taught small talk as well, that one head also refused real requests against long tool
lists: a 48-tool prompt gives soft tokens unlike the ~5-tool prompts of training
(reports/cascade-offtopic-n100). Here "is this a tool request at all" is a separate decision, made
by two detectors that fail in different places, and a request is refused only when both agree:

- MiniLM: the best cosine between the request's all-MiniLM-L6-v2 vector and an offered tool's. It
  does not depend on how the tools were read (more tools can only raise it, so a long library makes
  it more lenient, never stricter), but it reads English only and misses terse tool descriptions.
- the large model: a logistic regression on the soft token (the state that has read tools and
  request, in any language), trained on fc-train's call requests against off-topic requests
  (the ChatterBot corpus) shown tools of fc-train requests, both classes weighted equally.

Each threshold is the `max_false_refusals` quantile of its scores on the validation split's call
requests. The MiniLM test runs first and alone needs no large model: the router uses it to send
suspected small talk to the cascade, where the head has the last word.

A request far below the MiniLM threshold is *dismissed* without the large model's pass (which costs
as much as prompting the large model directly): its best cosine lies under the `max_false_dismissals`
quantile (0.1 %) of every fc-train call request's, and it is written in ASCII. MiniLM reads English
only, so a request in another language (accents, other scripts) can score low against the very tool
it asks for: those still go to the head. The cosine needs no large model, so the quantile is taken
over all of fc-train's call requests, not the gate's sample of them.

A gate directory holds manifest.json (format, thresholds, metrics) and gate.safetensors.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from hyfunc.cascade.data import Example, off_topic_requests, split_examples
from hyfunc.cascade.manifest import read_manifest, write_manifest
from hyfunc.cascade.selector import ToolVectors, tool_vectors_for
from hyfunc.formats.schema import Tool
from hyfunc.models.minilm import MINILM_NAME, Embedder, MiniLMEmbedder

GATE_DIR = "off_topic"  # inside a cascade artifact
WEIGHTS = "gate.safetensors"
FORMAT = "hyfunc-off-topic-gate"
FORMAT_VERSION = 1


@dataclass
class OffTopicConfig:
    cosine_threshold: float = -1.0  # best request-tool MiniLM cosine below this: suspected off-topic
    head_threshold: float = float("-inf")  # soft-token head's logit of "a tool request" below this: off-topic
    max_false_refusals: float = 0.02  # each detector's share of validation call requests below its threshold
    dismiss_threshold: float = -1.0  # best cosine below this (an ASCII request): refused without the large model
    max_false_dismissals: float = 0.001  # fc-train's ASCII call requests below `dismiss_threshold`
    l2: float = 1e-2
    embedder: str = MINILM_NAME
    large_model: str = ""  # whose soft tokens the head reads
    metrics: dict[str, Any] = field(default_factory=dict)


def minilm_reads(request: str) -> bool:
    """Whether a request may be dismissed on its MiniLM cosine: MiniLM reads English, so only ASCII text."""
    return request.isascii()


class OffTopicGate:
    """`screen(request, tools)`: MiniLM alone (dismissed, suspected or clear); `confirms(soft_token)`:
    the soft-token head agrees with a suspicion."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 config: OffTopicConfig, embedder: Embedder | None = None):
        self.weight, self.bias, self.mean, self.std = weight.float(), bias.float(), mean.float(), std.float()
        self.config = config
        self.share_embedder(embedder or MiniLMEmbedder())

    def share_embedder(self, embedder: Embedder) -> None:
        """Embed with `embedder` (e.g. the router's SharedEmbedder, so a routed request is embedded once)."""
        previous: ToolVectors | None = getattr(self, "tool_vectors", None)
        self.embedder: Embedder = embedder
        self.tool_vectors = tool_vectors_for(embedder)  # cached by schema: a server sees the same tools again
        if previous is not None and getattr(previous.embedder, "name", None) == getattr(embedder, "name", None):
            self.tool_vectors.adopt(previous)  # same model: a library embedded before sharing is not embedded again

    @torch.no_grad()
    def best_cosine(self, request: str, tools: Sequence[Tool]) -> float:
        if not tools:
            return -1.0
        query = torch.from_numpy(self.embedder.embed([request])).float()[0]
        return float((self.tool_vectors(tools) @ query).max())

    @torch.no_grad()
    def head_logits(self, soft_tokens: torch.Tensor) -> torch.Tensor:
        return ((soft_tokens.float().reshape(-1, len(self.mean)) - self.mean) / self.std) @ self.weight + self.bias

    def screen(self, request: str, tools: Sequence[Tool]) -> str:
        """MiniLM's verdict, one embedding: "dismissed" (refuse without the large model), "suspected"
        (small talk, or a request MiniLM cannot read: the head decides) or "clear"."""
        if not tools:
            return "clear"  # nothing offered: nothing to gate
        cosine = self.best_cosine(request, tools)
        if cosine < self.config.dismiss_threshold and minilm_reads(request):
            return "dismissed"
        return "suspected" if cosine < self.config.cosine_threshold else "clear"

    def suspects(self, request: str, tools: Sequence[Tool]) -> bool:
        """No offered tool is close to the request (MiniLM): small talk, or a request MiniLM cannot read."""
        return self.screen(request, tools) != "clear"

    def confirms(self, soft_token: torch.Tensor) -> bool:
        """The large model's state reads the request as off-topic too."""
        return float(self.head_logits(soft_token)[0]) < self.config.head_threshold

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({"weight": self.weight, "bias": self.bias, "mean": self.mean, "std": self.std}, str(directory / WEIGHTS))
        manifest = {"format": FORMAT, "version": FORMAT_VERSION, "weights": WEIGHTS, "config": asdict(self.config)}
        return write_manifest(directory, manifest)

    @classmethod
    def load(cls, directory: str | Path, embedder: Embedder | None = None) -> OffTopicGate:
        directory = Path(directory)
        manifest = read_manifest(directory, FORMAT, FORMAT_VERSION, "off-topic gate")
        config = OffTopicConfig(**manifest["config"])
        if embedder is not None and getattr(embedder, "name", None) != config.embedder:
            raise ValueError(f"gate was trained on {config.embedder} vectors, not {getattr(embedder, 'name', None)}")
        state = load_file(str(directory / manifest["weights"]))
        return cls(state["weight"], state["bias"], state["mean"], state["std"], config, embedder)


# ---------------------------------------------------------------------------------------------
# training


@dataclass
class GateData:
    """Features of (request, offered tools) pairs: best MiniLM cosines, soft tokens, labels (1: a
    call request with its own tools, 0: an off-topic request shown some request's tools)."""

    best_cosines: torch.Tensor
    soft_tokens: torch.Tensor
    labels: torch.Tensor


def gate_pairs(calls: Sequence[Example], off_topic: Sequence[Example], seed: int) -> list[tuple[str, list[Tool], int]]:
    rng = random.Random(seed)
    return [(ex.query, ex.tools, 1) for ex in calls] + [(ex.query, rng.choice(calls).tools, 0) for ex in off_topic]


def gate_data(pairs: Sequence[tuple[str, list[Tool], int]], gate: OffTopicGate,
              soft_token: Callable[[str, list[Tool]], torch.Tensor], desc: str) -> GateData:
    cosines, tokens = [], []
    for query, tools, _ in tqdm(pairs, desc=desc, unit="req"):
        cosines.append(gate.best_cosine(query, tools))
        tokens.append(soft_token(query, tools).float().reshape(-1))
    return GateData(torch.tensor(cosines), torch.stack(tokens), torch.tensor([float(label) for *_, label in pairs]))


def fit_head(gate: OffTopicGate, data: GateData) -> None:
    """L2-regularised logistic regression on the normalised soft tokens, classes weighted equally,
    L-BFGS from zero (deterministic)."""
    x = data.soft_tokens
    gate.mean, gate.std = x.mean(0), x.std(0).clamp(min=1e-6)
    z = (x - gate.mean) / gate.std
    share = data.labels.mean()
    weights = torch.where(data.labels > 0, 0.5 / share, 0.5 / (1 - share))
    weight = torch.zeros(x.shape[1], requires_grad=True)
    bias = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=300, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(z @ weight + bias, data.labels, weight=weights)
        loss = loss + gate.config.l2 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    gate.weight, gate.bias = weight.detach(), bias.detach()


def calibrate_gate(gate: OffTopicGate, val: GateData) -> None:
    """Each threshold: the `max_false_refusals` quantile of the validation call requests' scores."""
    calls = val.labels > 0
    q = gate.config.max_false_refusals
    # "lower": at most a share q of the call requests lies strictly below the threshold.
    gate.config.cosine_threshold = float(np.quantile(val.best_cosines[calls].numpy(), q, method="lower"))
    gate.config.head_threshold = float(np.quantile(gate.head_logits(val.soft_tokens[calls]).numpy(), q, method="lower"))


def calibrate_dismissal(gate: OffTopicGate, calls: Sequence[Example]) -> dict[str, Any]:
    """`dismiss_threshold`: the `max_false_dismissals` quantile of the best cosines of the ASCII
    call requests among `calls` (at most that share of them lies strictly below it); returns what it
    measured, for the gate's metrics."""
    cosines = np.array([gate.best_cosine(ex.query, ex.tools) for ex in tqdm(calls, desc="off-topic gate: dismissal", unit="req")
                        if ex.answers and ex.tools and minilm_reads(ex.query)])
    if not len(cosines):
        raise ValueError("the dismissal threshold needs ASCII call requests with tools")
    gate.config.dismiss_threshold = float(np.quantile(cosines, gate.config.max_false_dismissals, method="lower"))
    return {"call_requests": len(cosines), "call_dismissed": float(np.mean(cosines < gate.config.dismiss_threshold))}


def gate_rates(gate: OffTopicGate, data: GateData) -> dict[str, float]:
    """Shares of call requests and of off-topic requests refused, by each detector and by the gate."""
    by_cosine = data.best_cosines < gate.config.cosine_threshold
    by_head = gate.head_logits(data.soft_tokens) < gate.config.head_threshold
    out: dict[str, float] = {}
    for name, mask in (("call", data.labels > 0), ("off_topic", data.labels == 0)):
        out[f"{name}_requests"] = int(mask.sum())
        for part, refused in (("minilm", by_cosine), ("head", by_head), ("gate", by_cosine & by_head)):
            out[f"{name}_refused_by_{part}"] = float(refused[mask].float().mean()) if mask.any() else float("nan")
    return out


def train_gate(examples: Sequence[Example], soft_token: Callable[[str, list[Tool]], torch.Tensor], large_model: str,
               config: OffTopicConfig | None = None, seed: int = 0, embedder: Embedder | None = None,
               max_per_class: int = 150, max_val_calls: int = 100, val_fraction: float = 0.1) -> OffTopicGate:
    """A gate for the large model whose soft tokens `soft_token(request, tools)` returns, trained
    on fc-train `examples` against the ChatterBot corpus on the split `hyfunc prepare` uses (at most
    `max_per_class` training requests of each class and `max_val_calls` validation call requests:
    every one costs a large-model pass), its dismissal threshold on every call request of `examples`
    (MiniLM only); its train / validation / dismissal rates are in `config.metrics`."""
    config = config or OffTopicConfig()
    config.large_model = large_model
    rng = random.Random(seed)
    train, val = split_examples(examples, val_fraction)
    off_train, off_val = split_examples(off_topic_requests(), val_fraction)
    calls_train, calls_val = [ex for ex in train if ex.answers and ex.tools], [ex for ex in val if ex.answers and ex.tools]
    if not calls_train or not calls_val:
        raise ValueError("the off-topic gate needs call requests with tools in both splits of the data")
    sample = lambda items, n: rng.sample(list(items), min(n, len(items)))  # noqa: E731
    gate = OffTopicGate(torch.zeros(0), torch.zeros(()), torch.zeros(0), torch.ones(0), config, embedder)
    train_data = gate_data(gate_pairs(sample(calls_train, max_per_class), sample(off_train, max_per_class), seed),
                           gate, soft_token, "off-topic gate: training requests")
    val_data = gate_data(gate_pairs(sample(calls_val, max_val_calls), off_val, seed + 1), gate, soft_token,
                         "off-topic gate: validation requests")
    fit_head(gate, train_data)
    calibrate_gate(gate, val_data)
    dismissal = calibrate_dismissal(gate, [*calls_train, *calls_val])
    config.metrics = {"train": gate_rates(gate, train_data), "validation": gate_rates(gate, val_data),
                      "dismissal": dismissal}
    return gate
