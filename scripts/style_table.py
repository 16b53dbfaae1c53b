"""Prompt-style comparison per model on the cases both styles answered (official checker verdicts).

Usage: python scripts/style_table.py reports/baseline > reports/baseline/styles.md
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

root = Path(sys.argv[1])
runs = defaultdict(dict)  # model -> style -> {id: record}
for cases in sorted(root.glob("*/cases.jsonl")):
    model, style = cases.parent.name.rsplit("-", 1)
    runs[model][style] = {r["id"]: r for r in map(json.loads, cases.read_text().splitlines())}

print("| model | style | cases | accuracy % | mean latency s |")
print("|---|---|---:|---:|---:|")
for model, styles in runs.items():
    if len(styles) < 2:
        continue
    common = set.intersection(*(set(records) for records in styles.values()))
    for style, records in styles.items():
        chosen = [records[i] for i in sorted(common)]
        accuracy = 100 * sum(r["correct"] for r in chosen) / len(chosen)
        latency = sum(r["latency"] for r in chosen) / len(chosen)
        print(f"| {model} | {style} | {len(chosen)} | {accuracy:.1f} | {latency:.2f} |")
