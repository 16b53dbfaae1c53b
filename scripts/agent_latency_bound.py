"""How fast the cascade could be on `hyfunc bench agent`, from the server stage times of runs already made.

Issue 48 asks for the cascade in at most 0.6x direct prompting's total latency. Both methods must do two
things with the large model: read the tools and the conversation (the cascade's library build and large
prefill; direct's prefill), and write the final answer from the tool results (text_reply). Only the
call itself differs (the cascade: gate, retrieval, small model, large values; direct: decoding the call).
So, from each run's measured stage sums:

- the cascade's floor: its own large-model reading and answer stages, as if its call cost nothing;
- direct's shared share: direct's total without its call decoding, the floor for any method that reads
  the same prompt at direct's speed and writes the same answer.

    python scripts/agent_latency_bound.py reports/agent-loop/long-tasks-head/agent.json \
      reports/agent-loop/llamacpp-avx512/agent.json reports/agent-loop/agent.json \
      --cascade cascade-previous-head cascade cascade --out reports/agent-loop/latency-bound
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hyfunc.eval.plots import pyplot

READ = ("library_build", "large_prefill", "gate")  # the cascade's large-model reading (the gate's pass too)
CALL = ("retrieve", "small_prefill", "small_decode", "large_values")
GROUPS = {"read tools and conversation": (*READ, "prefill"), "write the call": (*CALL, "decode"),
          "write the answer": ("text_reply",)}


def grouped(stages: dict[str, float]) -> dict[str, float]:
    unknown = set(stages) - {s for names in GROUPS.values() for s in names}
    if unknown:
        raise SystemExit(f"stages not in any group: {sorted(unknown)}")
    return {group: round(sum(stages.get(s, 0.0) for s in names), 1) for group, names in GROUPS.items()}


def run_row(path: Path, cascade_label: str) -> dict:
    run = json.loads(path.read_text())
    servers = {s["label"]: s["summary"] for s in run["servers"]}
    cascade, direct = servers[cascade_label], servers["direct-1.5b"]
    c, d = grouped(cascade["server_stages_s"]), grouped(direct["server_stages_s"])
    direct_total = direct["total_latency_s"]
    return {
        "run": str(path.parent), "machine": run["machine"], "git": run["git"]["commit"][:7],
        "correct": {"cascade": cascade["correct"], "direct": direct["correct"], "n": cascade["n"]},
        "total_s": {"cascade": cascade["total_latency_s"], "direct": direct_total},
        "stages_s": {"cascade": c, "direct": d},
        "measured_ratio": round(cascade["total_latency_s"] / direct_total, 3),
        "cascade_floor_ratio": round((c["read tools and conversation"] + c["write the answer"]) / direct_total, 3),
        "direct_shared_ratio": round((d["read tools and conversation"] + d["write the answer"]) / direct_total, 3),
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| run | CPU flags | correct (cascade / direct of n) | cascade / direct total s | measured ratio "
             "| cascade floor | direct's shared share |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        flags = " ".join(r["machine"]["speed_flags"])
        lines.append(f"| `{r['run']}` | {flags} | {r['correct']['cascade']} / {r['correct']['direct']} of "
                     f"{r['correct']['n']} | {r['total_s']['cascade']:.1f} / {r['total_s']['direct']:.1f} | "
                     f"{r['measured_ratio']:.2f} | {r['cascade_floor_ratio']:.2f} | {r['direct_shared_ratio']:.2f} |")
    lines += ["", "| run | method | " + " | ".join(GROUPS) + " |", "|---|---|" + "---:|" * len(GROUPS)]
    for r in rows:
        for method, stages in r["stages_s"].items():
            lines.append(f"| `{r['run']}` | {method} | " + " | ".join(f"{stages[g]:.1f}" for g in GROUPS) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels, bottoms = [], []
    for r in rows:
        for method in ("cascade", "direct"):
            labels.append(f"{' '.join(r['machine']['speed_flags'][-1:])}\n{method}")
            bottoms.append(0.0)
    colors = ("#4a7", "#c84", "#47a")
    for group, color in zip(GROUPS, colors):
        heights = [r["stages_s"][m][group] / r["total_s"]["direct"] for r in rows for m in ("cascade", "direct")]
        ax.bar(labels, heights, bottom=bottoms, color=color, label=group)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.axhline(0.6, color="#a44", linestyle="--", linewidth=1, label="target 0.6x direct")
    ax.set_ylabel("server seconds / direct's total")
    ax.set_title("bench agent: where the time goes (each run's own direct = 1)")
    ax.set_ylim(0, 1.5)
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="agent.json files of `hyfunc bench agent`")
    parser.add_argument("--cascade", nargs="+", required=True, help="the cascade's label in each run")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if len(args.cascade) != len(args.runs):
        parser.error("one --cascade label per run")
    rows = [run_row(path, label) for path, label in zip(args.runs, args.cascade)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bound.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / "bound.md").write_text(markdown(rows))
    plot(rows, args.out / "bound.png")
    print(markdown(rows))


if __name__ == "__main__":
    main()
