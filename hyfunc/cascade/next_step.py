"""The step after a tool result: answer in text, or call a tool again.

The cascade's large model reads the conversation in its own chat template, calls and results
included; the hidden state from which its first answer token would be decoded (the soft token)
already holds what it would do next. A linear head on that state, an L2-regularised logistic
regression of "the request is done: answer" (both classes weighted equally, solved by L-BFGS from
zero, deterministic), makes the decision; below its threshold the cascade goes on to retrieval
and the small model as for a first request.

Trained on conversations built from fc-train (`agent_steps.py`); the threshold is chosen on
leave-one-source-out predictions (each source scored by a head that never saw it), so it is set
on conversations unlike the ones the head learned from. Saved as a directory::

    next_step/manifest.json      format, threshold, hidden size, how it was trained and scored
    next_step/head.safetensors   weight (H,), bias (1,), mean (H,), std (H,)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from hyfunc.cascade.manifest import read_manifest, write_manifest

NEXT_STEP_DIR = "next_step"
WEIGHTS = "head.safetensors"
FORMAT = "hyfunc-next-step-head"
FORMAT_VERSION = 1


class OneKindOnly(ValueError):
    """The data gave conversations of one kind only (e.g. no request with several calls)."""


@dataclass
class NextStepConfig:
    threshold: float = 0.5  # P(answer) at or above it: answer in text
    l2: float = 1e-3
    large_model: str = ""  # the model whose hidden states the head reads
    training: dict = field(default_factory=dict)  # data, counts, held-out scores (for the record)


class NextStepHead:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 config: NextStepConfig):
        self.weight, self.bias, self.mean, self.std, self.config = weight, bias, mean, std, config

    @torch.no_grad()
    def p_answer(self, soft_tokens: torch.Tensor) -> torch.Tensor:
        """P(the request is done) of each soft token ((H,) -> scalar, (n, H) -> (n,))."""
        x = (soft_tokens.float() - self.mean) / self.std
        return torch.sigmoid(x @ self.weight + self.bias)

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({"weight": self.weight.contiguous(), "bias": self.bias.contiguous(), "mean": self.mean.contiguous(),
                   "std": self.std.contiguous()}, str(directory / WEIGHTS))
        manifest = {"format": FORMAT, "version": FORMAT_VERSION, "weights": WEIGHTS, "config": asdict(self.config)}
        return write_manifest(directory, manifest)

    @classmethod
    def load(cls, directory: str | Path) -> NextStepHead:
        directory = Path(directory)
        manifest = read_manifest(directory, FORMAT, FORMAT_VERSION, "next-step head")
        state = load_file(str(directory / manifest["weights"]))
        return cls(state["weight"], state["bias"], state["mean"], state["std"], NextStepConfig(**manifest["config"]))


def fit_head(soft_tokens: torch.Tensor, answers: torch.Tensor, config: NextStepConfig) -> NextStepHead:
    """The head fitted on (n, H) soft tokens and their labels (1: answer, 0: call)."""
    labels = answers.float()
    if len(labels) == 0 or labels.min() == labels.max():
        raise OneKindOnly("the next-step head needs conversations of both kinds: ending in an answer and in a call")
    mean, std = soft_tokens.float().mean(0), soft_tokens.float().std(0).clamp_min(1e-6)
    x = (soft_tokens.float() - mean) / std
    share = labels.mean()
    weights = torch.where(labels > 0, 0.5 / share, 0.5 / (1 - share))
    weight = torch.zeros(x.shape[1], requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(x @ weight + bias, labels, weight=weights)
        loss = loss + config.l2 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return NextStepHead(weight.detach(), bias.detach(), mean, std, config)


def held_out_scores(soft_tokens: torch.Tensor, answers: torch.Tensor, sources: Sequence[str],
                    config: NextStepConfig) -> torch.Tensor:
    """P(answer) of each conversation from a head trained on every other source (with data from
    one source only: on the other folds of five)."""
    groups = list(sources) if len(set(sources)) > 1 else [str(i % 5) for i in range(len(sources))]
    out = torch.empty(len(sources))
    for group in sorted(set(groups)):
        held = torch.tensor([g == group for g in groups])
        head = fit_head(soft_tokens[~held], answers[~held], config)
        out[held] = head.p_answer(soft_tokens[held])
    return out


def best_threshold(scores: torch.Tensor, answers: torch.Tensor, sources: Sequence[str]) -> float:
    """The threshold with the best mean accuracy over sources (each source weighs the same, so
    the largest one does not set it alone); ties go to the one nearest 0.5."""
    candidates = sorted({0.5, *(round(float(s), 4) for s in scores)})
    groups = [torch.tensor([s == source for s in sources]) for source in sorted(set(sources))]

    def mean_accuracy(threshold: float) -> float:
        right = (scores >= threshold) == answers.bool()
        return sum(float(right[g].float().mean()) for g in groups) / len(groups)

    return max(candidates, key=lambda t: (mean_accuracy(t), -abs(t - 0.5)))
