"""The cascade with and without `described_forms` on every fc-train example (both splits) whose gold
has a string value of a parameter whose description shows a form by quoted examples.

    python scripts/described_forms_check.py reports/described-forms/fc-train-described-forms.json
"""
import json, sys
from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.formats.calls import same_calls
from hyfunc.formats.grounding import described_examples, form_separators
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import DEFAULT_ARTIFACT, CascadeOptions, HyFuncMethod

train, val = split_examples(load_examples(['../shared/data/fc-train']))
picked = []
for split, data in (("train", train), ("validation", val)):
    for ex in data:
        tools = {t.name: t for t in parse_tools(ex.tools)}
        if any(isinstance(v, str) and tools.get(a.name) and k in tools[a.name].parameters
               and not tools[a.name].parameters[k].enum and form_separators(described_examples(tools[a.name].parameters[k].description))
               for a in ex.answers for k, v in a.arguments.items()):
            picked.append((split, ex))
main = HyFuncMethod.load(str(DEFAULT_ARTIFACT))
off = main.variant(CascadeOptions.without("described_forms"), "hyfunc-no-described_forms")
rows = []
for split, ex in picked:
    msgs = [{"role": "user", "content": ex.query}]
    tools = parse_tools(ex.tools)
    row = {"id": ex.id, "split": split, "gold": [[c.name, c.arguments] for c in ex.answers]}
    for name, m in (("hyfunc", main), ("hyfunc-no-described_forms", off)):
        a = m.answer(msgs, tools)
        row[name] = {"exact": same_calls(a.calls, ex.answers), "calls": [[c.name, c.arguments] for c in a.calls]}
    rows.append(row)
    print(json.dumps(row), flush=True)
summary = {n: sum(r[n]["exact"] for r in rows) for n in ("hyfunc", "hyfunc-no-described_forms")}
json.dump({"command": sys.argv, "n": len(rows), "exact": summary, "rows": rows}, open(sys.argv[1], "w"), indent=1)
print(summary, len(rows))
