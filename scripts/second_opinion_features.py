"""Issue 18, item 3: can the large model overrule the retriever's false refusals? Per request, without
the small model: the off-topic gate's and the retriever's decisions, and the large model's call score
from its soft-token pass (log P of `[{"name": "<tool>"` as the answer's first tokens, for the
retriever's top-5 tools). Diagnostic for reports/second-opinion/; removed after that report.

  python scripts/second_opinion_features.py bfcl <file of BFCL ids> <out.jsonl>
  python scripts/second_opinion_features.py fctrain <n per set> <out.jsonl>   # validation refusals"""
import json, sys, time, random
import torch
from hyfunc.cascade.lexical import lexical_scores
from hyfunc.formats.messages import request_text
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import HyFuncMethod, DEFAULT_ARTIFACT

def seq_logprob(large, state, text):
    ids = large.encode(text)
    cache = large.fork(state.cache)
    step = large.forward(ids=ids, cache=cache, logits_to_keep=len(ids))
    rows = state.logits[None] if len(ids) == 1 else torch.cat([state.logits[None], step.tail_logits[:-1]])
    lp = torch.log_softmax(rows.float(), -1)[range(len(ids)), ids]
    return float(lp.sum())

def features(m, messages, tools):
    t = time.perf_counter()
    req = request_text(messages)
    suspected = m.gate.suspects(req, tools)
    enc = m.encoder.encode(messages, tools)
    r = m.retriever
    with torch.no_grad():
        cosine = r.scores(enc.soft_token, enc.function_embeddings)
        scores = r.fuse(cosine, lexical_scores(req, tools))
        ans = float(r.answerability(enc.soft_token, [cosine]))
    order = torch.argsort(scores, descending=True).tolist()
    st = enc.state
    lp0 = torch.log_softmax(st.logits.float(), -1)
    top = torch.topk(lp0, 3)
    tool_lps = [seq_logprob(m.large, st, '[{"name": "' + tools[i].name + '"') for i in order[:5]]
    return {"gate": bool(suspected and m.gate.confirms(enc.soft_token)), "answerability": ans,
            "refused": ans < r.config.refusal_threshold, "top_score": float(scores.max()),
            "top_tool": tools[order[0]].name, "lp_open": seq_logprob(m.large, st, '[{"name": "'),
            "lp_tools": tool_lps, "top3": [(m.large.decode([int(i)]), round(float(v), 2)) for v, i in zip(top.values, top.indices)],
            "seconds": time.perf_counter() - t}

def bfcl_items(ids_file):
    from hyfunc.eval.bfcl import load_cases
    cats = ["simple", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple", "live_parallel",
            "live_parallel_multiple", "irrelevance", "live_irrelevance"]
    wanted = [l.strip() for l in open(ids_file) if l.strip()]
    cases = {}
    for c in cats:
        for case in load_cases(c, limit=25 if c != "live_parallel" else 16):
            cases[case.id] = case
    for cid in wanted:
        case = cases[cid]
        yield cid, case.category, case.messages, parse_tools(case.functions)

def fctrain_items(n):
    from hyfunc.cascade.data import load_examples, split_examples, augment_refusals
    _, val = split_examples(load_examples(["../shared/data/fc-train"]))
    callers = [e for e in val if e.answers and e.tools]
    rng = random.Random(0)
    aug = augment_refusals(callers, 1.0, 0)
    near = [e for e in aug if e.source == "augmented-near-miss" and e.tools]
    unrel = [e for e in aug if e.source == "augmented-unrelated"]
    for label, pool in (("near-miss", near), ("unrelated", unrel)):
        for e in rng.sample(pool, min(n, len(pool))):
            yield e.id, label, [{"role": "user", "content": e.query}], list(e.tools)

if __name__ == "__main__":
    m = HyFuncMethod.load(DEFAULT_ARTIFACT)
    items = bfcl_items(sys.argv[2]) if sys.argv[1] == "bfcl" else fctrain_items(int(sys.argv[2]))
    with open(sys.argv[3], "w") as f:
        for cid, label, messages, tools in items:
            row = {"id": cid, "label": label, **features(m, messages, tools)}
            f.write(json.dumps(row) + "\n"); f.flush()
            print(cid, label, row["gate"], row["refused"], round(row["answerability"], 2), round(row["lp_open"], 2), round(max(row["lp_tools"]), 2), row["top3"], round(row["seconds"], 1), flush=True)
