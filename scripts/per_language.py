"""BFCL accuracy per request language (script of the user turns), from the cases of earlier runs.

    python scripts/per_language.py OUT LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Each RUN_DIR holds a `cases.jsonl` written by `hyfunc eval bfcl`; the questions are read with
`hyfunc.eval.bfcl.load_cases` (the installed bfcl-eval data). A request's script is that of most of its letters; Latin requests with letters outside ASCII
(Spanish, Portuguese, French, ...) are counted apart. Writes OUT/per_language.{json,md,png}.
"""
from __future__ import annotations

import collections
import json
import sys
import unicodedata
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hyfunc.eval.bfcl import load_cases  # noqa: E402

SCRIPTS = ("CJK", "HANGUL", "HIRAGANA", "KATAKANA", "CYRILLIC", "ARABIC", "HEBREW", "THAI", "DEVANAGARI", "LATIN")


def questions(cases: dict[str, dict]) -> dict[str, str]:
    """id -> the text of its user turns, for the cases' categories (`hyfunc.eval.bfcl.load_cases`)."""
    out = {}
    for category in {row["category"] for row in cases.values()}:
        for case in load_cases(category):
            out[case.id] = " ".join(m["content"] for m in case.messages if m["role"] == "user")
    return out


def script_of(text: str) -> str:
    counts = collections.Counter()
    for ch in text:
        if ch.isalpha():
            name = unicodedata.name(ch, "")
            counts[next((s for s in SCRIPTS if s in name), "OTHER")] += 1
    if not counts:
        return "none"
    script = counts.most_common(1)[0][0]
    if script == "LATIN" and any(ord(ch) > 127 and ch.isalpha() for ch in text):
        return "LATIN, non-ASCII letters"
    return script


def main(out: Path, runs: dict[str, Path]) -> None:
    cases = {label: {r["id"]: r for r in map(json.loads, (d / "cases.jsonl").read_text().splitlines())}
             for label, d in runs.items()}
    text = questions(next(iter(cases.values())))
    ids = sorted(set.intersection(*(set(c) for c in cases.values())))
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for i in ids:
        groups[script_of(text[i])].append(i)
    table = {g: {"n": len(members), "ids": members if g != "LATIN" else None,
                 "correct": {label: sum(bool(c[i]["correct"]) for i in members) for label, c in cases.items()}}
             for g, members in sorted(groups.items(), key=lambda kv: -len(kv[1]))}
    out.mkdir(parents=True, exist_ok=True)
    (out / "per_language.json").write_text(json.dumps({"runs": {k: str(v) for k, v in runs.items()},
                                                        "command": sys.argv, "groups": table}, indent=1))
    labels = list(runs)
    lines = ["| script of the request | n | " + " | ".join(f"{label} correct" for label in labels) + " |",
             "|---|---:|" + "---:|" * len(labels)]
    for g, row in table.items():
        lines.append(f"| {g} | {row['n']} | " + " | ".join(
            f"{row['correct'][label]} ({100 * row['correct'][label] / row['n']:.0f} %)" for label in labels) + " |")
    (out / "per_language.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        ax.bar([j + k * width for j in range(len(table))],
               [100 * row["correct"][label] / row["n"] for row in table.values()], width, label=label)
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(table))],
                  [f"{g}\n(n={row['n']})" for g, row in table.items()], fontsize=7)
    ax.set_ylabel("BFCL accuracy %")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "per_language.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), {a.split("=", 1)[0]: Path(a.split("=", 1)[1]) for a in sys.argv[2:]})
