"""Which prompt writes the final answer after tool results best? Held-out fc-train conversations
(`hyfunc eval answers`' set: validation split, never trained on), one model, several ways of asking,
side by side on the same conversations: the share of replies that tell every result's key facts.

    python scripts/answer_prompt_variants.py --per-source 10 --engine llamacpp --out reports/final-answers/prompts

Variants (the conversation is always rendered by the model's chat template, calls and results included):
  system     the hint in the system prompt (as served until this experiment)
  restated   the hint in the system prompt, and the request asked again after the results, as a
             user turn that names the functions whose results to use (`with_results_reminder`,
             adopted: reports/final-answers/prompts)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from hyfunc.eval.final_answers import fact_told, held_out_answer_steps
from hyfunc.eval.provenance import provenance
from hyfunc.models.base import PrefixCache
from hyfunc.models.engines import load_backend
from hyfunc.serving.replies import ANSWER_FROM_RESULTS, with_results_reminder, write_text


def variant_messages(name: str, messages: list[dict]) -> list[dict]:
    system = [{"role": "system", "content": ANSWER_FROM_RESULTS}]
    if name == "system":
        return system + messages
    if name == "restated":
        return with_results_reminder(system + messages)
    raise ValueError(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", default=None, help="fc-train files (default: the embedded set)")
    parser.add_argument("--per-source", type=int, default=10)
    parser.add_argument("--model", default="qwen-coder-1.5b")
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--variants", nargs="+", default=["system", "restated"])
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.data is None:
        from hyfunc.data import FC_TRAIN

        args.data = [str(FC_TRAIN)]
    steps = held_out_answer_steps(args.data, args.per_source)
    backend = load_backend(args.model, args.engine, role="large")
    caches = {v: PrefixCache(backend) for v in args.variants}
    rows = []
    for i, step in enumerate(steps):
        row = {"id": step.id, "source": step.source, "facts": step.facts,
               "results": sum(m["role"] == "tool" for m in step.messages)}
        for v in args.variants:  # side by side: each conversation under every variant in turn
            reply = write_text(backend, variant_messages(v, step.messages), args.max_tokens, prefix_cache=caches[v],
                               hold_calls=True)
            told = [f for f in step.facts if fact_told(f, reply.text)]
            row[v] = {"reply": reply.text, "call_text": reply.call_text, "told": told,
                      "all_told": len(told) == len(step.facts), "seconds": reply.seconds}
        rows.append(row)
        print(i, step.source, {v: row[v]["all_told"] for v in args.variants}, flush=True)

    def figures(subset: list[dict]) -> dict:
        facts = max(sum(len(r["facts"]) for r in subset), 1)
        return {v: {"n": len(subset), "all_facts_told": sum(r[v]["all_told"] for r in subset) / max(len(subset), 1),
                    "facts_told": sum(len(r[v]["told"]) for r in subset) / facts,
                    "held_back_as_calls": sum(bool(r[v]["call_text"]) for r in subset),
                    "median_seconds": statistics.median(r[v]["seconds"] for r in subset) if subset else 0.0}
                for v in args.variants}

    summary = {"all": figures(rows), "several_results": figures([r for r in rows if r["results"] > 1]),
               "one_result": figures([r for r in rows if r["results"] == 1])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "variants.json").write_text(json.dumps({"command": "python " + " ".join(sys.argv), "provenance": provenance(),
                                                   "engine": backend.engine, "model": args.model, "summary": summary},
                                                  indent=2) + "\n")
    with open(out / "replies.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
