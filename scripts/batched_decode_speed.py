"""What batching across requests gives on this CPU, on the llama.cpp engine (issue 50, "measure first").

N sequences, as N concurrent requests would hold, each after its own prompt. Timed side by side:
- prefill: the N prompts one after another (one llama_decode each, as the single worker runs them)
  vs all N in one llama_decode (one sequence id per prompt);
- decode: T tokens per sequence, one sequence at a time (N*T single-token decodes) vs T steps
  that each decode one token of every sequence in one batch.
The tokens are fixed (not sampled): the cost of a step does not depend on which token it is.

    python scripts/batched_decode_speed.py --model qwen-coder-1.5b --sequences 1 2 4 8 --out reports/batching/decode.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from hyfunc.eval.provenance import provenance
from hyfunc.models.llamacpp import LlamaCppBackend


def _run(backend: LlamaCppBackend, kvs: list, tokens: list[list[int]]) -> None:
    """One llama_decode of `tokens[i]` after `kvs[i]` for every i (each its own sequence id)."""
    lib, batch = backend._lib, backend._batch
    batch.n_tokens = sum(len(t) for t in tokens)
    j = 0
    for kv, ids in zip(kvs, tokens):
        for k, tid in enumerate(ids):
            batch.token[j], batch.pos[j], batch.n_seq_id[j] = tid, kv.length + k, 1
            batch.seq_id[j][0], batch.logits[j] = kv.seq, k == len(ids) - 1
            j += 1
    backend._check(lib.llama_decode(backend._ctx, batch))
    for kv, ids in zip(kvs, tokens):
        kv.length += len(ids)


def measure(backend: LlamaCppBackend, n: int, prompt: int, steps: int, repeats: int) -> dict:
    ids = backend.tokenizer("Find the weather in Paris and book a table for two at eight tonight, please. " * 40)["input_ids"]
    prompts = [ids[i:i + prompt] for i in range(n)]  # different prompts: nothing shared
    result: dict[str, list[float]] = {"prefill_sequential": [], "prefill_batched": [], "decode_sequential": [], "decode_batched": []}
    for _ in range(repeats):
        for mode in ("sequential", "batched"):
            kvs = [backend._new_kv() for _ in range(n)]
            start = time.perf_counter()
            if mode == "sequential":
                for kv, p in zip(kvs, prompts):
                    _run(backend, [kv], [p])
            else:
                _run(backend, kvs, prompts)
            result[f"prefill_{mode}"].append(time.perf_counter() - start)
            start = time.perf_counter()
            if mode == "sequential":
                for kv in kvs:
                    for step in range(steps):
                        _run(backend, [kv], [[ids[step]]])
            else:
                for step in range(steps):
                    _run(backend, kvs, [[ids[step]]] * n)
            result[f"decode_{mode}"].append(time.perf_counter() - start)
            for kv in kvs:
                backend._release(kv.seq)
                kv._finalizer.detach()
    medians = {k: statistics.median(v) for k, v in result.items()}
    return {
        "sequences": n, "prompt_tokens": prompt, "decode_steps": steps, "repeats": repeats,
        **{f"{k}_s": round(v, 4) for k, v in medians.items()},
        "prefill_speedup": round(medians["prefill_sequential"] / medians["prefill_batched"], 3),
        "decode_speedup": round(medians["decode_sequential"] / medians["decode_batched"], 3),
        "decode_ms_per_step_batched": round(1000 * medians["decode_batched"] / steps, 2),
        "decode_ms_per_token_alone": round(1000 * medians["decode_sequential"] / (n * steps), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-coder-1.5b", help="default alias or .gguf")
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--prompt", type=int, default=48, help="prompt tokens per sequence (a request after a cached library)")
    parser.add_argument("--steps", type=int, default=24, help="decoded tokens per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    backend = LlamaCppBackend(args.model, n_ctx=8192, n_seq=max(args.sequences) + 1)
    _run(backend, [backend._new_kv()], [[1, 2, 3, 4]])  # warm-up
    rows = []
    for n in args.sequences:
        rows.append(measure(backend, n, args.prompt, args.steps, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["python", "scripts/batched_decode_speed.py", *sys.argv[1:]]),
                               **provenance(), "model": backend.description, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
