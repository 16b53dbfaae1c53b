"""What hidden states cost on llama.cpp: one pass after a cached prefix, with the hidden states of every
position, of the last only (`hidden_to_keep=1`), and with none (logits of the last position only).

With hidden states on, llama.cpp outputs every position of a batch, and so runs the vocabulary head for
each; `hidden_to_keep` runs the positions whose states are not read with hidden states off.

    python scripts/hidden_state_cost.py --model qwen-coder-1.5b --repeats 4 \
      --out reports/agent-loop/latency-bound/hidden-state-cost.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hyfunc.eval.machine import cpu_info, git_state
from hyfunc.models.llamacpp import LlamaCppBackend

# A tool block and an agent turn (a request, a call, its result), repeated to typical lengths.
PREFIX = ('{"name": "get_weather", "description": "Current weather of a city", "parameters": {"type": "object", '
          '"properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}\n')
SUFFIX = ("What's the weather in Lisbon and in Oslo? <tool_call>{\"name\": \"get_weather\", \"arguments\": "
          "{\"city\": \"Lisbon\"}}</tool_call> <tool_response>75 degrees fahrenheit, sunny</tool_response> ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen-coder-1.5b")
    parser.add_argument("--prefix-repeats", type=int, default=12)
    parser.add_argument("--suffix-repeats", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    backend = LlamaCppBackend(args.model, n_ctx=8192)
    prefix, suffix = backend.encode(PREFIX * args.prefix_repeats), backend.encode(SUFFIX * args.suffix_repeats)
    cached = backend.forward(ids=prefix).cache
    variants = {"hidden of every position": {"output_hidden": True},
                "hidden of the last (hidden_to_keep=1)": {"output_hidden": True, "hidden_to_keep": 1},
                "no hidden states": {}}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    last: dict[str, torch.Tensor] = {}
    for _ in range(args.repeats):  # interleaved, so drift hits every variant alike
        for name, kwargs in variants.items():
            start = time.perf_counter()
            out = backend.forward(ids=suffix, cache=backend.fork(cached), **kwargs)
            seconds[name].append(round(time.perf_counter() - start, 3))
            if out.hidden is not None:
                last[name] = out.hidden[-1]
    every, kept = (last[name] for name in list(variants)[:2])
    result = {
        "command": "python scripts/hidden_state_cost.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "machine": cpu_info(), "git": git_state(), "model": args.model,
        "prefix_tokens": len(prefix), "suffix_tokens": len(suffix),
        "seconds": seconds, "median_s": {name: statistics.median(xs) for name, xs in seconds.items()},
        "soft_token_cosine": float(torch.nn.functional.cosine_similarity(every, kept, dim=0)),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("prefix_tokens", "suffix_tokens", "median_s", "soft_token_cosine")}, indent=2))


if __name__ == "__main__":
    main()
