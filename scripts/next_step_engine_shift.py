"""The shipped next-step head (trained on transformers' hidden states) read on another engine's soft
tokens of the same agent conversations: how far does the engine move its decisions?

    hyfunc prepare --next-step-only --out COPY_OF_CASCADE --engine llamacpp --report DIR   # caches the soft tokens
    python scripts/next_step_engine_shift.py --soft-tokens $HYFUNC_HOME/next-step-cache/soft-tokens-<engine key>.safetensors

The conversations are rebuilt exactly as `hyfunc prepare` builds them (`agent_steps`, same data, per
source and seed); the head saw them in training (as transformers states), so this measures the
engine's shift, not held-out accuracy.
"""
from __future__ import annotations

import argparse
import json

import torch
from safetensors.torch import load_file

from hyfunc.cascade.agent_steps import ANSWER, agent_steps
from hyfunc.cascade.data import load_examples
from hyfunc.cascade.next_step import NEXT_STEP_DIR, NextStepHead
from hyfunc.cascade.next_step_training import source_figures, step_key
from hyfunc.data import FC_TRAIN
from hyfunc.methods.cascade import DEFAULT_ARTIFACT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soft-tokens", required=True, help="the cache file `hyfunc prepare --next-step-only` wrote")
    parser.add_argument("--artifact", default=str(DEFAULT_ARTIFACT))
    parser.add_argument("--per-source", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    steps = agent_steps(load_examples([str(FC_TRAIN)]), args.per_source, args.seed)
    cached = load_file(args.soft_tokens)
    missing = [s.id for s in steps if step_key(s) not in cached]
    if missing:
        raise SystemExit(f"{len(missing)} of {len(steps)} conversations not in the cache: another data set or --per-source")
    soft = torch.stack([cached[step_key(s)] for s in steps])
    head = NextStepHead.load(f"{args.artifact}/{NEXT_STEP_DIR}")
    answers = torch.tensor([s.label == ANSWER for s in steps])
    sources = [s.source for s in steps]
    figures = source_figures(head.p_answer(soft), answers, sources, head.config.threshold)
    print(json.dumps({"threshold": head.config.threshold, "figures": figures}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
