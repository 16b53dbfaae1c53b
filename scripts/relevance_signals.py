"""Issue 49: can the large model's own pass tell "no tool fits" better than the refusal head?

For each single-turn case (BFCL layout: a held-out data folder, or bfcl-eval's categories) one
large-model pass over the cascade's prompt (instruction + tools + request), as the cascade runs it,
then two untrained signals of that state:

- `p_call`: the model's probability that its reply starts with a call (next_step_signals.py);
- `p_yes`: after the pass, a question in a new user turn ("Can one of the functions above do
  what I asked?"), the model's P(yes) / (P(yes) + P(no)) for the first answer token. With
  `--records` (a committed run's cases.jsonl) a second question names the tools the cascade
  retrieved for that case (`p_yes_named`).

The question is written in Qwen's chat markup (the default large model's). Rows go to --out as
JSON lines, one per case, resumable. `--replay` then applies "refuse when the signal is below t" on
top of committed runs (it can only turn calls into no call) and prints what each threshold gains
and loses; it also scores two signals that need no model, from a run's own calls: `grounded`, the
share of their values the request states, and `grounded_tokens`, the same word by word (refused at
= 0, < 1/3 and <= 1/2).

    python scripts/relevance_signals.py --data reports/ood/held-out/data \
      --records reports/ood/held-out/hyfunc_hyfunc-loso-sv/cases.jsonl --out /tmp/relevance/held-out.jsonl
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.eval.bfcl import load_cases
from hyfunc.formats.grounding import stated_numbers
from hyfunc.formats.schema import parse_tools
from hyfunc.models.engines import load_backend

sys.path.insert(0, str(Path(__file__).parent))
from next_step_signals import call_start_ids, p_call  # noqa: E402

QUESTION = "Can one of the functions above do what I asked? Answer yes or no."
NAMED = "Can {names} do what I asked? Answer yes or no."
YES, NO = ("yes", "Yes", " yes", " Yes", "YES"), ("no", "No", " no", " No", "NO")


def word_ids(tokenizer, words) -> list[int]:
    ids = (tokenizer.encode(w, add_special_tokens=False) for w in words)
    return sorted({found[0] for found in ids if len(found) == 1})


def p_yes(backend, state, question: str, yes: list[int], no: list[int]) -> float:
    """P(yes) / (P(yes) + P(no)) for the first token of the answer to `question`, asked in a new
    user turn after the pass (its assistant turn left empty), on a fork of the pass's state."""
    text = f"<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    step = backend.forward(ids=backend.encode(text), cache=backend.fork(state.cache))
    probs = torch.softmax(step.logits.float(), -1)
    y, n = float(probs[yes].sum()), float(probs[no].sum())
    return y / (y + n) if y + n > 0 else 0.5


def cases_of(args):
    if args.data:
        folder = Path(args.data)
        categories = sorted(p.stem.split("_", 1)[1] for p in folder.glob("OOD_*.json"))
        for category in categories:
            for case in load_cases(category, data_dir=folder):
                yield case
    for category in args.categories:
        yield from load_cases(category, limit=args.limit)


def run(args) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["id"] for line in out.open()} if out.is_file() else set()
    records = {}
    for path in args.records:
        for line in open(path):
            r = json.loads(line)
            records[r["id"]] = r
    large = load_backend(args.model, args.engine, role="large")
    encoder = SoftTokenEncoder(large)
    starts = call_start_ids(large.tokenizer)
    yes, no = word_ids(large.tokenizer, YES), word_ids(large.tokenizer, NO)
    with out.open("a") as sink:
        for case in cases_of(args):
            if case.id in done:
                continue
            start = time.perf_counter()
            tools = parse_tools(case.functions)
            encoding = encoder.encode(case.messages, tools)
            row = {"id": case.id, "category": case.category, "no_call": case.possible_answer in (None, []),
                   "p_call": round(p_call(encoding.state.logits, starts), 5),
                   "p_yes": round(p_yes(large, encoding.state, QUESTION, yes, no), 5)}
            retrieved = (records.get(case.id) or {}).get("details", {}).get("retrieved")
            if retrieved:
                names = " and ".join(f"`{n}`" for n in retrieved)
                row["p_yes_named"] = round(p_yes(large, encoding.state, NAMED.format(names=names), yes, no), 5)
            row["seconds"] = round(time.perf_counter() - start, 2)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(json.dumps(row), flush=True)


def grounded(calls: list[dict], request: str) -> float:
    """The share of the scalar values in `calls` (BFCL's {name: arguments} form) that the request
    states (lower-cased, punctuation as spaces); 1.0 when there is none."""
    def norm(text) -> str:
        return " ".join(re.sub(r"[^a-z0-9]+", " ", str(text).lower()).split())
    values = [v for call in calls for arguments in call.values() for v in arguments.values()
              if isinstance(v, (str, int, float)) and not isinstance(v, bool) and norm(v)]
    said = f" {norm(request)} "
    return sum(f" {norm(v)} " in said for v in values) / len(values) if values else 1.0


def _scalars(value):
    if isinstance(value, (list, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _scalars(item)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield value


def grounded_tokens(calls: list[dict], request: str) -> float:
    """A lenient `grounded`: a number counts when the request states it (`grounding.stated_numbers`:
    any format, words up to twelve), a string when one of its words is in the request; values
    inside lists and objects count too."""
    def words(text) -> set[str]:
        return set(re.findall(r"\w+", str(text).lower().replace(",", "")))
    said_words, said_numbers = words(request), stated_numbers(request)
    values = [v for call in calls for arguments in call.values() for v in _scalars(arguments)]
    if not values:
        return 1.0
    stated = [float(v) in said_numbers if not isinstance(v, str) else bool(words(v) & said_words) for v in values]
    return sum(stated) / len(values)


def replay(args) -> None:
    """Refuse where the signal is below t, on top of each committed run: gained / lost per t.
    `grounded` (with --data or --categories): the recorded calls' own values against the request."""
    rows = {json.loads(line)["id"]: json.loads(line) for line in open(args.out)} if Path(args.out).is_file() else {}
    requests = {case.id: " ".join(m["content"] for m in case.messages if m["role"] == "user") for case in cases_of(args)}
    for path in args.records:
        cases = [json.loads(line) for line in open(path)]
        for c in cases:  # cases without model signals: `grounded` only
            rows.setdefault(c["id"], {"no_call": c["category"] in ("irrelevance", "live_irrelevance")})
        base = sum(c["correct"] for c in cases)
        no_call = [c for c in cases if rows[c["id"]]["no_call"]]
        print(f"\n{path}: {len(cases)} cases, {base} right; no-call {sum(c['correct'] for c in no_call)}/{len(no_call)}")
        for c in cases:
            if c["id"] in requests and c["calls"] and isinstance(c["calls"], list):
                rows[c["id"]]["grounded"] = grounded(c["calls"], requests[c["id"]])
                rows[c["id"]]["grounded_tokens"] = grounded_tokens(c["calls"], requests[c["id"]])
        for signal in ("p_call", "p_yes", "p_yes_named", "grounded", "grounded_tokens"):
            for t in args.thresholds if not signal.startswith("grounded") else [0.01, 0.34, 0.51]:
                gained = lost = refused_calls = 0
                for c in cases:
                    value = rows[c["id"]].get(signal)
                    if value is None or value >= t or not c["calls"]:
                        continue
                    if rows[c["id"]]["no_call"]:
                        gained += not c["correct"]
                    else:
                        refused_calls += 1
                        lost += c["correct"]
                print(f"  {signal:12s} < {t:<5}: +{gained} no-call, -{lost} right calls ({refused_calls} call cases refused)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a folder of OOD_<category>.json files (hyfunc eval ood's data/)")
    parser.add_argument("--categories", nargs="*", default=[], help="bfcl-eval categories")
    parser.add_argument("--limit", type=int, default=25)
    parser.add_argument("--records", nargs="*", default=[], help="committed cases.jsonl of runs to replay")
    parser.add_argument("--model", default="qwen-coder-1.5b")
    parser.add_argument("--engine", default="llamacpp")
    parser.add_argument("--out", required=True)
    parser.add_argument("--replay", action="store_true", help="only replay the rows in --out on --records")
    parser.add_argument("--thresholds", nargs="*", type=float, default=[0.05, 0.1, 0.2, 0.3, 0.5])
    args = parser.parse_args()
    if not args.replay:
        run(args)
    replay(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
