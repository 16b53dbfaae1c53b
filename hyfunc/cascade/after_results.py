"""A second small model for the steps after tool results, beside the one that answers requests.

Trained on agent conversations (`hyfunc prepare --agent-only --agent-kinds after_results
--after-results-model`), the small model writes the calls still due after some results, with
values a result gave; trained into the cascade's own adapter instead, the same training also
moved its answers to first requests (reports/agent-steps/). Kept apart, in the artifact's
`after_results/` (its LoRA adapter and projector), it is used only when the conversation ends with
tool results: a request without them is answered exactly as by the cascade without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hyfunc.cascade.small_model import SoftTokenProjector, load_projector
from hyfunc.cascade.templating import TemplateDecoder
from hyfunc.models.base import BackendBase
from hyfunc.models.engines import load_backend

AFTER_RESULTS_DIR = "after_results"


@dataclass
class SmallWriter:
    """A small model with its trained projector and its templating decoder: what writes the calls."""

    backend: BackendBase
    projector: SoftTokenProjector | None
    decoder: TemplateDecoder

    @classmethod
    def of(cls, backend: BackendBase, projector: SoftTokenProjector | None) -> SmallWriter:
        return cls(backend, projector.to(backend.device).eval() if projector is not None else None,
                   TemplateDecoder(backend))

    def warm_up(self) -> None:
        """The decoder's vocabulary tables take about a second to build: at load, not in a request."""
        self.decoder.vocab(int(self.backend.forward(ids=self.backend.encode("[")).logits.shape[-1]))


def load_after_results(artifact: Path, small_model: str, engine: str, device: str | None) -> SmallWriter | None:
    """The artifact's after-results small model, or None when it has none."""
    directory = artifact / AFTER_RESULTS_DIR
    if not (directory / "adapter").is_dir():
        return None
    backend = load_backend(small_model, engine, device=device, adapter=directory / "adapter", role="small")
    writer = SmallWriter.of(backend, load_projector(directory))
    writer.warm_up()
    return writer
