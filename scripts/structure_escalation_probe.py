"""Structural escalation probe (issue 18, item 1; reports/structure-escalation/): does the large model, prompted
with BFCL's system prompt (which spells out the call-list format) over the retrieved tools and given the shipped
cascade's calls as the start of its answer, add the calls the cascade leaves out? fc-train validation only.

    python scripts/structure_escalation_probe.py 90 reports/structure-escalation/fc-validation.json

Per request: the cascade's answer; then, for three tool sets (retrieved, top 5 of the ranking, all offered), one
pass of the large model over [BFCL prompt + request + the cascade's calls in python syntax without the closing
")]"], its top next tokens, and its greedy continuation; calls it adds after the cascade's (valid under the
tools' schemas, not repeats) are appended. Rows are written after every request."""
import json, sys, time, statistics
import torch
from tqdm.auto import tqdm
from hyfunc.cascade.data import call_pattern, load_examples, sample_by_pattern, split_examples
from hyfunc.data import FC_TRAIN
from hyfunc.formats.bfcl import bfcl_prompt_messages
from hyfunc.formats.calls import CallParseError, parse_python_calls, render_python_calls, same_calls
from hyfunc.formats.validate import argument_errors
from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod

def main():
    limit, out = int(sys.argv[1]), sys.argv[2]
    _, val = split_examples(load_examples([FC_TRAIN]))
    callers = [ex for ex in val if ex.answers and ex.tools]
    requests = sample_by_pattern(callers, limit, 0) if limit < len(callers) else callers
    cascade = HyFuncMethod.load(DEFAULT_ARTIFACT)
    large = cascade.large
    rows = []
    for ex in tqdm(requests):
        msgs = [{"role": "user", "content": ex.query}]
        t0 = time.perf_counter(); ans = cascade.answer(msgs, ex.tools); t_c = time.perf_counter() - t0
        row = {"id": ex.id, "pattern": call_pattern(ex), "n_gold": len(ex.answers), "n_tools": len(ex.tools),
               "gold": [[c.name, c.arguments] for c in ex.answers], "cascade": [[c.name, c.arguments] for c in ans.calls],
               "cascade_exact": same_calls(ans.calls, ex.answers), "cascade_s": t_c}
        by_name = {t.name: t for t in ex.tools}
        variants = {"retrieved": ans.details.get("retrieved", []), "top5": ans.details.get("ranking", [])[:5], "all": [t.name for t in ex.tools]}
        for label, names in variants.items():
            if not ans.calls:
                row[label] = None; continue
            tools = [by_name[n] for n in dict.fromkeys(list(names) + [c.name for c in ans.calls])]
            try:
                draft = render_python_calls(ans.calls)[:-2]  # without the last ")]"
            except ValueError as e:
                row[label] = {"skip": str(e)}; continue
            prompt = large.chat_prompt(bfcl_prompt_messages(msgs, tools))
            t0 = time.perf_counter()
            ids = large.encode(prompt + draft)
            with torch.inference_mode():
                step = large.forward(ids=ids)
            logp = torch.log_softmax(step.logits.float(), -1)
            top = torch.topk(logp, 8)
            tops = [(large.decode([int(i)]), round(float(v), 3)) for v, i in zip(top.values, top.indices)]
            def done(text):
                t = draft + text
                if not t.endswith("]"): return False
                try: parse_python_calls(t); return True
                except CallParseError: return False
            first = int(torch.argmax(step.logits))
            gen = large.generate(ids=[first], cache=step.cache, max_new_tokens=160, stop=lambda t: done(large.decode([first]) + t))
            text = large.decode([first]) + gen.text
            secs = time.perf_counter() - t0
            extra, err = [], None
            try:
                full = parse_python_calls(draft + text)
                extra = full[len(ans.calls):]
                probs = [p for c in extra for p in argument_errors(c, tools)]
                if probs: err = "; ".join(probs); extra = []
            except CallParseError as e:
                err = str(e)
            extra = [c for c in extra if not any(same_calls([c], [d]) for d in ans.calls)]
            final = list(ans.calls) + extra
            row[label] = {"text": text, "tops": tops, "extra": [[c.name, c.arguments] for c in extra], "error": err,
                          "exact": same_calls(final, ex.answers), "seconds": secs, "prompt_tokens": len(ids)}
        rows.append(row)
        json.dump(rows, open(out, "w"), indent=1, default=str)
    print("n", len(rows), "cascade exact", sum(r["cascade_exact"] for r in rows))
    for label in ("retrieved", "top5", "all"):
        rs = [r for r in rows if r.get(label) and "exact" in r[label]]
        print(label, "exact", sum(r[label]["exact"] if r.get(label) and "exact" in r[label] else r["cascade_exact"] for r in rows),
              "extra on", sum(bool(r[label]["extra"]) for r in rs),
              "gained", sum(r[label]["exact"] and not r["cascade_exact"] for r in rs),
              "lost", sum(r["cascade_exact"] and not r[label]["exact"] for r in rs),
              "median s", statistics.median(r[label]["seconds"] for r in rs))

main()
