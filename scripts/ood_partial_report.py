"""The per-kind report of an interrupted `hyfunc eval ood` run, from the cases every method has scored so
far (rerunning the command resumes the run instead, and writes the same report at its end).

    python scripts/ood_partial_report.py reports/ood/agentdojo "hyfunc@transformers" ... "direct:qwen-coder-1.5b"

Labels as the run printed them, the main method first.
"""
import json
import sys
from pathlib import Path

from hyfunc.eval.ood import first_calls_right, kind_markdown, kind_plot, kind_summary
from hyfunc.eval.records import read_case_records
out, labels = Path(sys.argv[1]), sys.argv[2:]
kinds = json.loads((out / "data" / "kinds.json").read_text())
records = {label: read_case_records(out / label.replace(":", "_").replace("/", "_")) for label in labels}
done = set.intersection(*({r["id"] for r in recs} for recs in records.values()))
kinds = {k: v for k, v in kinds.items() if k in done}
baseline = next((label for label in labels if label.startswith("direct:")), None)
summary = kind_summary(records, kinds, labels[0], baseline)
summary["first_call"] = first_calls_right({label: [r for r in recs if r["id"] in kinds] for label, recs in records.items()},
                                          out / "data")
summary["set"] = {"scored_by_every_method": len(done), "cases_in_set": len(json.loads((out / "data" / "kinds.json").read_text()))}
(out / "kinds.json").write_text(json.dumps(summary, indent=2) + "\n")
(out / "kinds.md").write_text(kind_markdown(summary) + "\n")
kind_plot(summary, out / "kinds.png")
print(kind_markdown(summary))
