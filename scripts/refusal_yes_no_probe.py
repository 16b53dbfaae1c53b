"""Yes/no probes of the large model after its soft-token pass, for the retriever's refusals listed
in the feature files: the conversation continues with a user question, and the score is
log P(yes) - log P(no) for the answer's first token."""
import json, sys, time
import torch
from hyfunc.cascade.data import augment_refusals, load_examples, split_examples
from hyfunc.eval.bfcl import load_cases
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod

QUESTIONS = {
    "fulfil": "Can one of the functions above be used for my request? Answer with yes or no.",
    "asks": "Does my request ask for something that one of the functions above does? Answer with yes or no.",
}

def probe(m, state, question):
    text = f"<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    ids = m.large.encode(text)
    step = m.large.forward(ids=ids, cache=m.large.fork(state.cache))
    lp = torch.log_softmax(step.logits.float(), -1)
    tok = lambda w: m.large.encode(w)[0]
    yes = torch.logsumexp(lp[[tok("Yes"), tok("yes")]], 0)
    no = torch.logsumexp(lp[[tok("No"), tok("no")]], 0)
    return float(yes - no)

if __name__ == "__main__":
    m = HyFuncMethod.load(DEFAULT_ARTIFACT)
    _, val = split_examples(load_examples(["../shared/data/fc-train"]))
    callers = [e for e in val if e.answers and e.tools]
    made = augment_refusals(callers, 1.0, 0)
    items = {e.id: ([{"role": "user", "content": e.query}], list(e.tools)) for e in callers + made}
    for c in ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
              "live_parallel", "live_parallel_multiple", "irrelevance", "live_irrelevance"]:
        for case in load_cases(c):
            try:
                items[case.id] = (case.messages, parse_tools(case.functions))
            except Exception:
                pass
    out = open(sys.argv[-1], "w")
    for path in sys.argv[1:-1]:
        for line in open(path):
            r = json.loads(line)
            if not r["refused"] or r["gate"]:
                continue
            t = time.perf_counter()
            messages, tools = items[r["id"]]
            with torch.inference_mode():
                enc = m.encoder.encode(messages, tools)
                row = {"id": r["id"], "label": r["label"], **{k: probe(m, enc.state, q) for k, q in QUESTIONS.items()}}
            out.write(json.dumps(row) + "\n"); out.flush()
            print(row, round(time.perf_counter() - t, 1), flush=True)
