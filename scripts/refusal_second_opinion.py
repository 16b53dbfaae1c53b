"""Issue 18, item 3: second opinions on the retriever's refusals. For each request the retriever
refuses (the off-topic gate clear), from the same large-model pass and the small model:

- `large`: the large model's call score, the best over the retriever's top-5 tools of
  log P(`[{"name": "<tool>"`) as its answer's first tokens (reports/second-opinion/);
- `small_margin`: the small model, shown the retriever's top tools (the selection it would make if
  it had not refused) and the soft token, log P(`[{"name": "`) - log P(`[]`) as its answer's start;
- `small_calls`: the calls the small model writes there when left to choose (`require_call=False`).

  python scripts/refusal_second_opinion.py bfcl <file of BFCL ids> <out.jsonl>
  python scripts/refusal_second_opinion.py fctrain <n per set> <out.jsonl>   # validation split"""
from __future__ import annotations

import json
import random
import sys
import time

import torch

from hyfunc.cascade.data import augment_refusals, load_examples, split_examples
from hyfunc.cascade.lexical import lexical_scores
from hyfunc.cascade.small_model import build_small_prompt, prompt_embeds
from hyfunc.formats.messages import request_text
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod


def continuation_logprob(backend, state, text: str) -> float:
    """log P(text) as the next tokens after `state` (a StepOutput with logits and cache)."""
    ids = backend.encode(text)
    step = backend.forward(ids=ids, cache=backend.fork(state.cache), logits_to_keep=len(ids))
    rows = state.logits[None] if len(ids) == 1 else torch.cat([state.logits[None], step.tail_logits[:-1]])
    return float(torch.log_softmax(rows.float(), -1)[range(len(ids)), ids].sum())


def features(m: HyFuncMethod, messages, tools) -> dict:
    t = time.perf_counter()
    request = request_text(messages)
    if m.gate is not None and m.gate.screen(request, tools) == "dismissed":
        return {"gate": True, "refused": True}
    enc = m.encoder.encode(messages, tools)
    r = m.retriever
    with torch.no_grad():
        cosine = r.scores(enc.soft_token, enc.function_embeddings)
        scores = r.fuse(cosine, lexical_scores(request, tools))
        answerable = float(r.answerability(enc.soft_token, [cosine]))
    gated = bool(m.gate is not None and m.gate.suspects(request, tools) and m.gate.confirms(enc.soft_token))
    row = {"gate": gated, "answerability": answerable, "refused": answerable < r.config.refusal_threshold}
    if gated or not row["refused"]:
        return row | {"seconds": time.perf_counter() - t}
    order = torch.argsort(scores, descending=True, stable=True).tolist()
    row["top_tool"] = tools[order[0]].name
    with torch.inference_mode():
        row["large"] = max(continuation_logprob(m.large, enc.state, '[{"name": "' + tools[i].name + '"')
                           for i in order[:5])
        chosen = r.select_from_scores(scores, float("inf"))
        selected = [tools[i] for i in chosen]
        prompt = build_small_prompt(m.small, request, selected, with_soft_token=True)
        step = m.small.forward(embeds=prompt_embeds(m.small, m.projector, prompt, enc.soft_token))
        row["small_margin"] = (continuation_logprob(m.small, step, '[{"name": "')
                               - continuation_logprob(m.small, step, "[]"))
        out = m.decoder.decode(step, selected, require_call=False, draft_source=request)
    row["selected"] = [x.name for x in selected]
    row["small_calls"] = [{c.name: c.arguments} for c in out.calls]
    return row | {"seconds": time.perf_counter() - t}


def bfcl_items(ids_file):
    from hyfunc.eval.bfcl import load_cases
    wanted = [line.strip() for line in open(ids_file) if line.strip()]
    categories = sorted({w.rsplit("_", 1)[0] for w in wanted})
    cases = {c.id: c for cat in categories for c in load_cases(cat)}
    for cid in wanted:
        case = cases[cid]
        yield cid, case.category, case.messages, parse_tools(case.functions), None


def fctrain_items(n: int):
    _, val = split_examples(load_examples(["../shared/data/fc-train"]))
    callers = [e for e in val if e.answers and e.tools]
    rng = random.Random(0)
    made = augment_refusals(callers, 1.0, 0)
    near = [e for e in made if e.source == "augmented-near-miss" and e.tools]
    unrelated = [e for e in made if e.source == "augmented-unrelated"]
    for label, pool in (("call", callers), ("near-miss", near), ("unrelated", unrelated)):
        for e in rng.sample(pool, min(n, len(pool))):
            gold = [{c.name: c.arguments} for c in e.answers] if label == "call" else []
            yield e.id, label, [{"role": "user", "content": e.query}], list(e.tools), gold


if __name__ == "__main__":
    method = HyFuncMethod.load(DEFAULT_ARTIFACT)
    source, arg, out_path = sys.argv[1:4]
    items = bfcl_items(arg) if source == "bfcl" else fctrain_items(int(arg))
    with open(out_path, "w") as f:
        for cid, label, messages, tools, gold in items:
            row = {"id": cid, "label": label, **features(method, messages, tools)}
            if gold is not None:
                row["gold"] = gold
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(cid, label, row["gate"], row["refused"], round(row.get("answerability", 0), 2),
                  round(row.get("large", 0), 2), round(row.get("small_margin", 0), 2), len(row.get("small_calls", [])),
                  round(row.get("seconds", 0), 1), flush=True)
