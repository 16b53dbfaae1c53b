"""Write a smaller fixed library for `hyfunc bench odia --library`: the gold tools of the requests the
full library's scenario would replay (stream + held-out), plus tools drawn at random from the rest
of the library (seeded) up to `--size`.

Why: on a CPU without AMX, embedding the 4,076-tool Seal-Tools library tool by tool with the 1.5B on
llama.cpp takes about two hours (~450k tokens at ~60 tokens/s); a quarter of it keeps the scenario
(a library far too large for a prompt, read per function, retrieved by the library retriever) at a
quarter of that cost. Fewer distractors make retrieval easier: results on a subset are not the full
library's.

    python scripts/library_subset.py --stream 120 --held-out 32 --size 1024 --out artifacts/sealtools-1024.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from hyfunc.cascade.library import load_library
from hyfunc.data import FC_TRAIN, TOOL_LIBRARY
from hyfunc.eval.odia_bench import OdiaBenchConfig, scenario


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", default=str(TOOL_LIBRARY))
    parser.add_argument("--data", nargs="+", default=[str(FC_TRAIN)])
    parser.add_argument("--stream", type=int, default=120)
    parser.add_argument("--held-out", type=int, default=32)
    parser.add_argument("--size", type=int, required=True, help="tools in the subset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the subset (JSON Lines, one schema per line)")
    args = parser.parse_args()

    library = load_library(args.library)
    stream, held = scenario(args.data, library, OdiaBenchConfig(stream=args.stream, held_out=args.held_out, seed=args.seed))
    gold = {c.name for ex in stream + held for c in ex.answers}
    if len(gold) > args.size:
        parser.error(f"the replayed requests call {len(gold)} tools: --size must be at least that")
    rest = [t for t in library if t.name not in gold]
    chosen = gold | {t.name for t in random.Random(args.seed).sample(rest, args.size - len(gold))}
    raw = [json.loads(line) for line in Path(args.library).read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [r for r, t in zip(raw, library) if t.name in chosen]  # library order, the file's own schemas
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
    print(f"{len(kept)} tools ({len(gold)} called by the {len(stream)} + {len(held)} replayed requests) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
