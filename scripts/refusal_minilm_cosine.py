"""MiniLM's best cosine between the request and an offered tool (the off-topic gate's measure) for the
retriever's refusals in feature files written by refusal_second_opinion.py (reports/second-opinion/).

  python scripts/refusal_minilm_cosine.py <features.jsonl> [...] <out.json>"""
import json
import sys

from hyfunc.cascade.data import augment_refusals, load_examples, split_examples
from hyfunc.cascade.off_topic import GATE_DIR, OffTopicGate
from hyfunc.eval.bfcl import load_cases
from hyfunc.formats.messages import request_text
from hyfunc.formats.schema import SchemaError, parse_tools
from hyfunc.methods.cascade import DEFAULT_ARTIFACT

CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
              "live_parallel", "live_parallel_multiple", "irrelevance", "live_irrelevance"]

if __name__ == "__main__":
    gate = OffTopicGate.load(DEFAULT_ARTIFACT / GATE_DIR)
    _, val = split_examples(load_examples(["../shared/data/fc-train"]))
    callers = [e for e in val if e.answers and e.tools]
    items = {e.id: (e.query, list(e.tools)) for e in callers + augment_refusals(callers, 1.0, 0)}
    for category in CATEGORIES:
        for case in load_cases(category):
            try:
                items[case.id] = (request_text(case.messages), parse_tools(case.functions))
            except SchemaError:
                pass  # a case whose schema the cascade refuses is not among the refusals
    cosine = {}
    for path in sys.argv[1:-1]:
        for line in open(path):
            row = json.loads(line)
            if row["refused"] and not row["gate"]:
                cosine[row["id"]] = gate.best_cosine(*items[row["id"]])
    json.dump(cosine, open(sys.argv[-1], "w"), indent=0)
