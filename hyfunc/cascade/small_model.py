"""The small model (LMS) prompted with the large model's soft token as one continuous token.

Prompt layout (the small model's own chat template)::

    <system>  SMALL_INSTRUCTION + the retrieved tools, one JSON schema per line
    <user>    the request, then one continuous token: projector(soft token)
    <assistant generation prompt>  -> the call list, written through dynamic templating

The soft token sits right after the request, where the small model reads it last before it
answers. The prompt is rendered with a placeholder string at that spot and split there: both
halves are tokenized separately and the projected vector goes between their embeddings.

Training (`soft_prefix_loss`) teacher-forces the target call text and puts the loss only on the
tokens the templating decoder lets the model choose (values and structural choices), not on the
boilerplate it injects. The projector and a LoRA adapter (peft) are trained together.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from hyfunc.cascade.soft_token import tool_line
from hyfunc.formats.schema import Tool
from hyfunc.models.backend import Backend

SMALL_INSTRUCTION = (
    "You write function calls. Answer with a JSON list of calls "
    '[{"name": ..., "arguments": {...}}] to the functions below, or [] when none of them fits the request.'
)
TOOLS_HEADER = "\n\nFunctions, one JSON schema per line:\n"
_SOFT_MARK = "<<hyfunc-soft-token-2b8e1d>>"


@dataclass
class SmallPrompt:
    before_ids: list[int]  # everything up to the soft token (system, tools, request)
    after_ids: list[int]  # end of the user turn and the assistant generation prompt
    soft_slot: bool = True  # False: a prompt without the soft token (the ablation), all in before_ids

    @property
    def soft_position(self) -> int:
        return len(self.before_ids)

    def __len__(self) -> int:
        return len(self.before_ids) + int(self.soft_slot) + len(self.after_ids)


class SoftTokenProjector(nn.Module):
    """Maps the large model's hidden size to the small model's embedding size (HyFunc's W_p)."""

    def __init__(self, large_hidden: int, small_hidden: int):
        super().__init__()
        self.proj = nn.Linear(large_hidden, small_hidden)

    def forward(self, soft_token: torch.Tensor) -> torch.Tensor:
        return self.proj(soft_token)


def build_small_prompt(backend: Backend, request: str, tools: Sequence[Tool], with_soft_token: bool = True) -> SmallPrompt:
    """Token ids around the soft token's slot (without it, `after_ids` follows the request directly)."""
    system = SMALL_INSTRUCTION + (TOOLS_HEADER + "\n".join(tool_line(t) for t in tools) if tools else "")
    user = request + ("\n" + _SOFT_MARK if with_soft_token else "")
    text = backend.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": user}])
    if not with_soft_token:
        return SmallPrompt(backend.encode(text), [], soft_slot=False)
    before, after = text.split(_SOFT_MARK)
    return SmallPrompt(backend.encode(before), backend.encode(after))


def prompt_embeds(
    backend: Backend, projector: SoftTokenProjector | None, prompt: SmallPrompt, soft_token: torch.Tensor | None
) -> torch.Tensor:
    """(len, hidden) input embeddings of the prompt with the projected soft token in its slot."""
    parts = [backend.embed(prompt.before_ids)]
    if soft_token is not None:
        if projector is None:
            raise ValueError("a soft token needs a projector")
        if not prompt.soft_slot:
            raise ValueError("this prompt was built without a slot for the soft token")
        soft = projector(soft_token.to(projector.proj.weight.device, projector.proj.weight.dtype))
        parts.append(soft.to(parts[0].device, parts[0].dtype).unsqueeze(0))
    if prompt.after_ids:
        parts.append(backend.embed(prompt.after_ids))
    return torch.cat(parts)


def soft_prefix_loss(
    backend: Backend,
    projector: SoftTokenProjector | None,
    prompt: SmallPrompt,
    soft_token: torch.Tensor | None,
    target_ids: Sequence[int],
    generated_mask: Sequence[bool],
) -> torch.Tensor:
    """Cross-entropy of the target tokens the model generates (injected tokens carry no loss)."""
    if len(target_ids) != len(generated_mask):
        raise ValueError("target_ids and generated_mask differ in length")
    table = backend.model.get_input_embeddings()
    target = torch.tensor(list(target_ids), device=table.weight.device)
    embeds = torch.cat([prompt_embeds(backend, projector, prompt, soft_token), table(target)])
    # Only the positions that predict target tokens need logits (the vocabulary projection of the
    # whole prompt would be wasted work): the last len(target) + 1, of which position t predicts t + 1.
    logits = backend.model(inputs_embeds=embeds.unsqueeze(0), logits_to_keep=len(target_ids) + 1).logits[0]
    predicted = logits[:-1]
    mask = torch.tensor(list(generated_mask), device=logits.device)
    if not mask.any():
        return predicted.sum() * 0.0  # nothing to learn here, but keep the graph connected
    return nn.functional.cross_entropy(predicted[mask].float(), target[mask])


def save_projector(projector: SoftTokenProjector, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in projector.state_dict().items()}, directory / "projector.safetensors")
    config = {"large_hidden": projector.proj.in_features, "small_hidden": projector.proj.out_features}
    (directory / "projector.json").write_text(json.dumps(config))


def load_projector(directory: Path) -> SoftTokenProjector:
    config = json.loads((directory / "projector.json").read_text())
    projector = SoftTokenProjector(config["large_hidden"], config["small_hidden"])
    projector.load_state_dict(load_file(directory / "projector.safetensors"))
    return projector.eval()
