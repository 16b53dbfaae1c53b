"""How many calls a request asks for, read off the soft token: a lower bound for the decoder.

The small model decides after each call whether another follows, and it tends to stop early
("the resistance of copper and aluminum wire" answered with one call). The large model's soft
token already encodes what the request asks for (like "does a tool fit", `retriever.py`'s refusal
head), so a linear classifier on it predicts the number of calls: 1, 2, 3 or 4+ (`CLASSES`).

The decoder is told only a lower bound: `at_least` is the largest k with P(calls >= k) >= the
calibrated `threshold`, and the decoder then writes at least k calls (separators injected until
then; the model still chooses each call's tool and values, and a call repeating an earlier one word
for word still ends the list). The threshold is the lowest on a grid that forces no validation
example above its true number of calls (`calibrate`), so it only acts where the head is sure.

A directory = manifest.json (format, threshold, metrics) + call_count.safetensors.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

CLASSES = 4  # 1, 2, 3, and 4 or more calls
FORMAT, FORMAT_VERSION = "hyfunc-call-count", 1
MANIFEST, WEIGHTS = "manifest.json", "call_count.safetensors"


class CallCountHead(nn.Module):
    def __init__(self, hidden: int, threshold: float | None = None):
        super().__init__()
        self.linear = nn.Linear(hidden, CLASSES)
        # Standardised input, as the retriever's: a few huge hidden dimensions would dominate.
        self.register_buffer("mean", torch.zeros(hidden))
        self.register_buffer("std", torch.ones(hidden))
        self.threshold = threshold  # None: never raises the bound (uncalibrated, or nothing was safe)
        self.meta: dict[str, Any] = {}

    def probabilities(self, soft_tokens: torch.Tensor) -> torch.Tensor:
        """(N, CLASSES) P(1 call), P(2), P(3), P(4+) for (N, H) soft tokens."""
        x = (soft_tokens.float().reshape(-1, self.mean.shape[0]) - self.mean) / self.std
        return self.linear(x).softmax(-1)

    @torch.no_grad()
    def lower_bounds(self, soft_tokens: torch.Tensor, threshold: float | None = None) -> list[int]:
        """Per soft token, the largest k with P(calls >= k) >= threshold (default: the head's; 1 if None)."""
        threshold = self.threshold if threshold is None else threshold
        if threshold is None:
            return [1] * soft_tokens.reshape(-1, self.mean.shape[0]).shape[0]
        at_least = self.probabilities(soft_tokens).flip(-1).cumsum(-1).flip(-1)  # [:, j] = P(calls >= j + 1)
        return [1 + max((j for j in range(CLASSES) if row[j] >= threshold), default=0) for row in at_least.tolist()]

    def at_least(self, soft_token: torch.Tensor) -> int:
        """The number of calls the decoder must write for a request that calls a tool."""
        return self.lower_bounds(soft_token)[0]

    def save(self, directory: str | Path, meta: dict[str, Any] | None = None) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, str(directory / WEIGHTS))
        manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "weights": WEIGHTS, "hidden_size": int(self.mean.shape[0]),
            "threshold": self.threshold, "meta": meta or {},
        }
        tmp = directory / (MANIFEST + ".tmp")  # written last: a directory without one is an interrupted save
        tmp.write_text(json.dumps(manifest, indent=2))
        tmp.replace(directory / MANIFEST)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> CallCountHead:
        path = Path(directory) / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{directory}: no {MANIFEST}; not a saved call-count head (or an interrupted save)")
        manifest = json.loads(path.read_text())
        if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path}: expected format {FORMAT!r} version {FORMAT_VERSION}, got "
                             f"{manifest.get('format')!r} version {manifest.get('version')!r}")
        head = cls(manifest["hidden_size"], manifest["threshold"])
        head.load_state_dict(load_file(str(Path(directory) / manifest["weights"])))
        head.meta = manifest.get("meta", {})
        return head.eval()


def count_class(n_calls: int) -> int:
    """The class index of a request with `n_calls` >= 1 calls."""
    if n_calls < 1:
        raise ValueError("only requests that call a tool have a call count")
    return min(n_calls, CLASSES) - 1


def train_call_count_head(soft_tokens: torch.Tensor, n_calls: Sequence[int], l2: float = 0.1) -> CallCountHead:
    """L2-regularised multinomial logistic regression, solved by L-BFGS from zero (deterministic).
    `l2` is strong: training requests are separable and an unregularised head is sure of everything."""
    labels = torch.tensor([count_class(n) for n in n_calls])
    if len(labels) == 0:
        raise ValueError("the call-count head needs training requests with calls")
    x = soft_tokens.float()
    head = CallCountHead(x.shape[1])
    head.mean.copy_(x.mean(0))
    head.std.copy_(x.std(0, unbiased=False).clamp_min(1e-6))
    nn.init.zeros_(head.linear.weight)
    nn.init.zeros_(head.linear.bias)
    inputs = (x - head.mean) / head.std
    optimizer = torch.optim.LBFGS(head.linear.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(head.linear(inputs), labels) + l2 * head.linear.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return head.eval()


def calibrate(head: CallCountHead, soft_tokens: torch.Tensor, n_calls: Sequence[int], grid: Sequence[float] | None = None) -> dict:
    """Set `head.threshold` to the lowest on `grid` at which no validation request is bounded above its
    own number of calls (a bound too high makes the answer wrong; one too low leaves it to the model)."""
    grid = list(np.round(np.arange(0.5, 1.0, 0.01), 2)) + [0.995, 0.999] if grid is None else list(grid)
    truth = [min(n, CLASSES) for n in n_calls]

    def outcome(threshold: float) -> tuple[int, int, int]:
        bounds = head.lower_bounds(soft_tokens, threshold) if len(truth) else []
        over = sum(b > t for b, t in zip(bounds, truth))
        raised = sum(b > 1 for b in bounds)
        exact = sum(b == t > 1 for b, t in zip(bounds, truth))
        return over, raised, exact

    head.threshold = next((float(t) for t in grid if outcome(t)[0] == 0), None)  # None: nothing on the grid is safe
    over, raised, exact = outcome(head.threshold) if head.threshold is not None else (0, 0, 0)
    return {
        "threshold": head.threshold, "validation_requests": len(truth),
        "multi_call_requests": sum(t > 1 for t in truth), "raised_above_one": raised,
        "bounded_exactly": exact, "bounded_too_high": over,
        "argmax_accuracy": float(np.mean([int(p) + 1 == t for p, t in zip(head.probabilities(soft_tokens).argmax(-1), truth)]))
        if truth else float("nan"),
    }
