"""The cascade's switchable stages (`HyFuncMethod`'s options): all on is the shipped cascade; an
ablation turns some off (`CascadeOptions.without`, `--ablate`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CascadeOptions:
    """Switches for the ablations; all on is the HyFunc cascade."""

    soft_token: bool = True  # insert the projected soft token into the small model's prompt
    retriever: bool = True  # False: the small model sees every offered tool
    templating: bool = True  # False: free greedy decoding of the call text, then parsed
    off_topic_gate: bool = True  # refuse small talk with the artifact's off-topic gate, if it has one
    # Scalar values written by the large model from its state after its pass (when that pass
    # read the tools), the rest by the small model (cascade/large_values.py): free strings,
    # enum members, numbers.
    large_values: bool = True
    large_choices: bool = True
    large_numbers: bool = True
    # A large model's string brought into the form its description shows by examples: with no
    # separator where they have one ("San Francisco" for 'City, State') it goes on from the
    # separator; ISO dates get two-digit months and days (large_values.py).
    described_forms: bool = True
    # The large model's values drafted from the small model's and from the request: the same
    # values, fewer passes of the large model (large_values.py).
    value_drafts: bool = True
    # Another call where the request lists an alternative to a value the calls use ("copper and
    # aluminum") and no call uses it (templating/alternatives.py).
    alternatives: bool = True
    # False: the large model writes the whole call list itself, continuing its pass over
    # [instruction + tools + request] under the templating decoder (constrained to the retrieved
    # tools), and the small model is not run: no small-model prefill of the retrieved tools.
    small_model: bool = True
    # On a follow-up user turn (earlier turns before it), the off-topic gate and the refusal head
    # read the new message alone (the head: one more short large-model pass): after any on-topic
    # request a conversation reads as on-topic to both. The tools are still ranked on the
    # conversation's pass; a library read per function leaves the refusal to the conversation.
    follow_up_alone: bool = True
    # With follow_up_alone, the gate's head confirms a suspected follow-up on the new message's pass
    # too, as it was calibrated (first requests); False: on the conversation's pass.
    gate_confirms_alone: bool = True

    @classmethod
    def without(cls, *stages: str) -> CascadeOptions:
        """Every stage on but `stages` (an ablation)."""
        return cls(**{stage: False for stage in stages})

    def large_value_kinds(self) -> tuple[str, ...]:
        on = {"string": self.large_values, "choice": self.large_choices, "number": self.large_numbers}
        return tuple(kind for kind, enabled in on.items() if enabled)
