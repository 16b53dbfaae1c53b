"""Phases of a `CI=true bash .ci/run` log whose lines carry seconds since the start (see
reports/install-anywhere/README.md for how the log is made): JSON + a bar chart per phase.

    python scripts/ci_phase_times.py LOG [LOG ...] --names NAME [NAME ...] --out reports/install-anywhere
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from hyfunc.eval.plots import pyplot

# The first line of each phase, in the order `make test` runs them (Makefile).
PHASES = [
    ("install: torch, hyfunc and its dependencies, the BFCL checker", re.compile(r"pip install -q torch==")),
    ("llama.cpp build (llama-cpp-python from source)", re.compile(r"--no-binary llama-cpp-python")),
    ("the default models' weights (data-only wheels)", re.compile(r"weights-all\.txt")),
    ("tests (pytest)", re.compile(r"-m pytest")),
]
LINE = re.compile(r"^\s*(\d+) (.*)$")
PASSED = re.compile(r"(\d+) passed.* in ([\d.]+)s")
END = re.compile(r"exit=(\d+) total=(\d+)s")


def phases(log: Path) -> dict:
    starts: dict[str, int] = {}
    result: dict = {}
    for raw in log.read_text(errors="replace").splitlines():
        end = END.search(raw)
        if end:
            result.update(exit=int(end.group(1)), total_s=int(end.group(2)))
            continue
        match = LINE.match(raw)
        if not match:
            continue
        second, text = int(match.group(1)), match.group(2)
        for name, pattern in PHASES:
            if name not in starts and pattern.search(text):
                starts[name] = second
        passed = PASSED.search(text)
        if passed:
            result.update(tests_passed=int(passed.group(1)), pytest_reported_s=float(passed.group(2)))
    names = [name for name, _ in PHASES if name in starts]
    bounds = [starts[n] for n in names] + [result.get("total_s", 0)]
    result["phases_s"] = {name: bounds[i + 1] - bounds[i] for i, name in enumerate(names)}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--names", nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = {name: phases(log) for name, log in zip(args.names, args.logs)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ci_phases.json").write_text(json.dumps(runs, indent=2) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(runs)))
    for row, (name, run) in enumerate(runs.items()):
        left = 0.0
        for i, (phase, seconds) in enumerate(run["phases_s"].items()):
            ax.barh(row, seconds / 60, left=left, color=f"C{i}", label=phase if row == 0 else None)
            left += seconds / 60
    ax.set_yticks(range(len(runs)), list(runs))
    ax.set_xlabel("minutes from a fresh clone")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)
    fig.tight_layout()
    fig.savefig(args.out / "ci_phases.png", dpi=120)
    print(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
