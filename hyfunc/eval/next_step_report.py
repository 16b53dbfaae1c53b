"""The next-step head's held-out report: next_step.json, README.md and a PNG per source."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Sequence

from hyfunc.eval.plots import bars_per_source
from hyfunc.eval.provenance import provenance, provenance_markdown


def write_report(directory: Path, record: dict, argv: Sequence[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    full = {"command": "hyfunc " + shlex.join(argv[1:]), "provenance": provenance(), **record}
    (directory / "next_step.json").write_text(json.dumps(full, indent=2) + "\n")
    rows = [
        f"| {source} | {f['n']} | {f['accuracy']:.1%} | {_pct(f['answer_recall'])} | {_pct(f['call_recall'])} |"
        for source, f in record["held_out"].items()
    ]
    lines = [
        "# Next step after a tool result: answer or call (held-out sources)",
        "",
        f"Command: `{full['command']}`",
        "",
        f"{record['conversations']} agent conversations built from fc-train (`hyfunc/cascade/agent_steps.py`), "
        f"up to {record['per_source']} of each kind per source; large model on {record['engine']}. Each source is "
        "scored by a head trained on the other sources only; the threshold "
        f"({record['threshold']}) has the best mean accuracy over sources.",
        "",
        "| source (held out) | n | accuracy | answer recall | call recall |",
        "|---|---|---|---|---|",
        *rows,
        "",
        provenance_markdown(full["provenance"]),
    ]
    (directory / "README.md").write_text("\n".join(lines) + "\n")
    sources = [s for s in record["held_out"] if s != "all"]
    bars_per_source(directory / "next_step.png", {s: record["held_out"][s]["accuracy"] for s in sources},
                    "held-out accuracy", "answer-vs-call after a tool result, leave-one-source-out", target=0.95)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"
