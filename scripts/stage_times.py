"""Per-stage latency of the methods of a side-by-side BFCL run (`hyfunc eval bfcl --with-...`).

Reads each method's cases.jsonl under a run directory and prints, per method, the mean and median
seconds per case of every stage in `timings` (large_prefill, retrieve, small_prefill, small_decode
for the cascade; prefill, decode for direct prompting) and of the whole answer, as a markdown table.

    python scripts/stage_times.py reports/engines/bfcl-n40
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def stage_table(run_dir: Path) -> str:
    rows = []
    stages: list[str] = []
    for cases in sorted(run_dir.glob("*/cases.jsonl")):
        records = [json.loads(line) for line in cases.read_text().splitlines() if line.strip()]
        if not records:
            continue
        names = list(dict.fromkeys(k for r in records for k in r.get("timings", {})))
        stages += [s for s in names if s not in stages]
        per_stage = {s: [r.get("timings", {}).get(s, 0.0) for r in records] for s in names}
        total = [sum(r.get("timings", {}).values()) for r in records]
        rows.append((cases.parent.name, len(records), per_stage, total))
    head = "| method | n | " + " | ".join(f"{s} mean / median s" for s in stages) + " | total mean / median s |"
    lines = [head, "|---|---:|" + "---:|" * (len(stages) + 1)]
    for name, n, per_stage, total in rows:
        cells = [
            f"{statistics.fmean(per_stage[s]):.2f} / {statistics.median(per_stage[s]):.2f}" if s in per_stage else ""
            for s in stages
        ]
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + f" | {statistics.fmean(total):.2f} / {statistics.median(total):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(stage_table(Path(sys.argv[1])))
