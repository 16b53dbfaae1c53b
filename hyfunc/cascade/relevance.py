"""The relevance check: does a selected tool do what the request asks? A cross-encoder's answer.

The retriever's refusal head decides "no tool fits" from the soft token, a state that has read
every offered tool at once; near misses (the request's own domain, a neighbouring function: BFCL's
irrelevance cases look like this) score almost like real requests there (reports/refusal-head,
reports/second-opinion). This check reads one (request, tool) pair at a time with full attention
between the two: all-MiniLM-L6-v2 with a LoRA adapter and a one-logit head, trained on fc-train's
requests against the tools they call (relevant) and the offered tools they do not call (near
misses), plus tools of other requests and small talk (unrelated).

The cascade asks it only about the tools the retriever selected (a few pairs, milliseconds), after
the large model's pass, and refuses when none of them reaches the threshold: the
`max_false_refusals` quantile of the best gold tool's logit over validation call requests.

A relevance directory holds manifest.json (format, threshold, metrics) and adapter/ (peft).
"""
from __future__ import annotations

import json
import random
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from hyfunc.cascade.data import Example, data_hash, load_examples, off_topic_requests, split_examples
from hyfunc.cascade.manifest import MANIFEST, read_manifest, write_manifest
from hyfunc.formats.schema import Tool
from hyfunc.models.minilm import checked_minilm_dir

RELEVANCE_DIR = "relevance"  # inside a cascade artifact
ADAPTER_DIR = "adapter"
FORMAT = "hyfunc-relevance"
FORMAT_VERSION = 1
OFF_TOPIC_PAIRS = 300  # small talk against a random tool: a sample is enough to learn it is not a request
MAX_TOKENS = 192  # request + tool text; a longer pair loses tokens from its longer part's end


@dataclass
class RelevanceConfig:
    threshold: float = float("-inf")  # best selected tool's logit below this: "no tool fits"
    max_false_refusals: float = 0.02  # share of validation call requests whose gold tool scores below it
    hard_per_example: int = 3  # offered tools a request does not call, as negatives
    mined_per_example: int = 0  # other requests' tools closest to a called one, as negatives
    lora_rank: int = 16
    epochs: int = 2
    learning_rate: float = 5e-4
    seed: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)


def tool_text(tool: Tool) -> str:
    """What the cross-encoder reads of a tool: name, description, parameters and theirs."""
    params = "; ".join(f"{name}: {p.description}" if p.description else name for name, p in tool.parameters.items())
    return f"{tool.name}: {tool.description.strip()} Parameters: {params}"


def _base_model():
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = checked_minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True, num_labels=1,
                                                               dtype=torch.float32)
    return model, tokenizer


def _lora(model, rank: int):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.05,
                        target_modules=["query", "key", "value", "dense"], modules_to_save=["classifier"])
    return get_peft_model(model, config)


class RelevanceModel:
    """Logits of "this tool does what the request asks" for (request, tool) pairs."""

    def __init__(self, model, tokenizer, config: RelevanceConfig) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config
        self._lock = threading.Lock()  # one forward at a time: the server's threads share it

    def logits(self, request: str, tools: Sequence[Tool], batch_size: int = 32) -> np.ndarray:
        texts = [tool_text(t) for t in tools]
        out: list[np.ndarray] = []
        for start in range(0, len(texts), batch_size):
            chunk = texts[start:start + batch_size]
            enc = self.tokenizer([request or " "] * len(chunk), chunk, padding=True, truncation=True,
                                 max_length=MAX_TOKENS, return_tensors="pt")
            with self._lock, torch.inference_mode():
                out.append(self.model(**enc).logits[:, 0].float().numpy())
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def best(self, request: str, tools: Sequence[Tool]) -> float:
        """The best tool's logit; -inf for no tools."""
        return float(self.logits(request, tools).max()) if tools else float("-inf")

    def refuses(self, request: str, tools: Sequence[Tool]) -> bool:
        return self.best(request, tools) < self.config.threshold

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory / ADAPTER_DIR, safe_serialization=True)
        write_manifest(directory, {"format": FORMAT, "version": FORMAT_VERSION, "base": "all-MiniLM-L6-v2",
                                   "config": asdict(self.config)})

    @classmethod
    def load(cls, directory: Path) -> RelevanceModel:
        from peft import PeftModel

        manifest = read_manifest(directory, FORMAT, FORMAT_VERSION, "relevance model")
        model, tokenizer = _base_model()
        model = PeftModel.from_pretrained(model, directory / ADAPTER_DIR).merge_and_unload()
        return cls(model, tokenizer, RelevanceConfig(**manifest["config"]))


def _nearest_tools(pool: Sequence[Tool], k: int) -> dict[str, list[Tool]]:
    """Per tool name, the `k` other tools of `pool` whose text MiniLM finds closest (another name)."""
    from hyfunc.models.minilm import MiniLMEmbedder

    unique = list({t.name: t for t in pool}.values())
    vectors = torch.from_numpy(MiniLMEmbedder().embed([tool_text(t) for t in unique]))
    similarity = vectors @ vectors.T
    similarity.fill_diagonal_(-2.0)
    nearest = similarity.topk(min(k, len(unique) - 1), dim=1).indices if len(unique) > 1 else torch.empty(len(unique), 0)
    return {tool.name: [unique[j] for j in row.tolist()] for tool, row in zip(unique, nearest)}


def relevance_pairs(examples: Sequence[Example], off_topic: Sequence[Example], seed: int, hard_per_example: int = 3,
                    mined_per_example: int = 0) -> list[tuple[str, Tool, float]]:
    """(request, tool, label) for every call request: each tool it calls (1), up to
    `hard_per_example` offered tools it does not call (0: near misses), the `mined_per_example`
    tools of other requests closest to a called one (0: neighbouring functions, as a retriever
    would offer them), one tool of another request sharing no name (0); each off-topic request
    against one random tool (0)."""
    rng = random.Random(seed)
    callers = [e for e in examples if e.answers]
    pool = [t for e in callers for t in e.tools]
    nearest = _nearest_tools(pool, mined_per_example) if mined_per_example else {}
    pairs: list[tuple[str, Tool, float]] = []
    for ex in callers:
        called = {c.name for c in ex.answers}
        tools = {t.name: t for t in ex.tools}
        pairs += [(ex.query, tools[name], 1.0) for name in sorted(called) if name in tools]
        others = [t for t in ex.tools if t.name not in called]
        pairs += [(ex.query, t, 0.0) for t in rng.sample(others, min(hard_per_example, len(others)))]
        neighbours = [t for name in sorted(called) for t in nearest.get(name, []) if t.name not in tools]
        pairs += [(ex.query, t, 0.0) for t in list({t.name: t for t in neighbours}.values())[:mined_per_example]]
        unrelated = rng.choice(pool)
        if unrelated.name not in tools:
            pairs.append((ex.query, unrelated, 0.0))
    pairs += [(ex.query, rng.choice(pool), 0.0) for ex in off_topic]
    rng.shuffle(pairs)
    return pairs


def gold_best(model: RelevanceModel, examples: Sequence[Example]) -> np.ndarray:
    """Per call request, the best logit among the tools it calls (what the retriever should select)."""
    scores = []
    for ex in tqdm([e for e in examples if e.answers], desc="relevance: validation", unit="request"):
        called = {c.name for c in ex.answers}
        scores.append(model.best(ex.query, [t for t in ex.tools if t.name in called]))
    return np.array(scores, dtype=np.float64)


def train_relevance(train: Sequence[Example], val: Sequence[Example], off_topic: Sequence[Example],
                    config: RelevanceConfig | None = None, batch_size: int = 16) -> RelevanceModel:
    """Fine-tune the cross-encoder on `train`'s pairs, then place the threshold on `val`'s call requests."""
    config = config or RelevanceConfig()
    torch.manual_seed(config.seed)
    base, tokenizer = _base_model()
    model = _lora(base, config.lora_rank)
    pairs = relevance_pairs(train, off_topic, config.seed, config.hard_per_example, config.mined_per_example)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    steps = config.epochs * ((len(pairs) + batch_size - 1) // batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 50) * max(0.0, 1 - i / steps))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    model.train()
    losses: list[float] = []
    with tqdm(total=steps, desc="relevance: training", unit="batch") as bar:
        for epoch in range(config.epochs):
            random.Random(config.seed + epoch).shuffle(pairs)
            for start in range(0, len(pairs), batch_size):
                batch = pairs[start:start + batch_size]
                enc = tokenizer([q for q, _, _ in batch], [tool_text(t) for _, t, _ in batch], padding=True,
                                truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
                loss = loss_fn(model(**enc).logits[:, 0], torch.tensor([y for _, _, y in batch]))
                loss.backward()
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
    relevance = RelevanceModel(model, tokenizer, config)
    best = gold_best(relevance, val)
    config.threshold = float(np.quantile(best, config.max_false_refusals)) if len(best) else float("-inf")
    config.metrics = {"pairs": len(pairs), "positives": int(sum(y for _, _, y in pairs)), "final_loss": float(np.mean(losses[-50:])),
                      "validation_call_requests": len(best)}
    return relevance


def add_relevance(artifact: Path, data: Sequence[str], seed: int = 0, config: RelevanceConfig | None = None) -> dict:
    """Train (again) the relevance check of the cascade in `artifact` on `data` (split into training and
    validation by id hash), leaving its other parts as they are; the manifest records the data and
    metrics. Returns them."""
    config = config or RelevanceConfig(seed=seed)
    manifest = json.loads((artifact / MANIFEST).read_text())
    train, val = split_examples(load_examples(list(data)))
    off_topic, _ = split_examples(off_topic_requests())
    off_topic = random.Random(seed).sample(off_topic, min(OFF_TOPIC_PAIRS, len(off_topic)))
    started = time.perf_counter()
    model = train_relevance(train, val, off_topic, config)
    shutil.rmtree(artifact / RELEVANCE_DIR, ignore_errors=True)
    model.save(artifact / RELEVANCE_DIR)
    metrics = {**model.config.metrics, "threshold": model.config.threshold,
               "data": {"paths": list(data), "sha256": data_hash(list(data))}}
    manifest["config"]["relevance"] = True
    manifest["metrics"]["relevance"] = metrics
    manifest.setdefault("seconds", {})["relevance"] = time.perf_counter() - started
    write_manifest(artifact, manifest)
    return metrics
