"""reports/cpu-llamacpp/odia-distil-scale/distillation.png: the small path against the cascade and gold
on 90 fc-train validation requests, by how many teacher answers were distilled.

    python scripts/plot_distillation_scale.py reports/cpu-llamacpp/odia-distil-scale/distillation.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

BASE = "reports/cpu-llamacpp/"
RUNS = [(0, BASE + "odia-distil-agreed/fc-val-small-path-cascade-adapter.json"),
        (24, BASE + "odia-distil-agreed/fc-val-small-path-distilled-all.json"),
        (125, BASE + "odia-distil-scale/fc-val-small-path-distilled-125.json")]
CASCADE_EXACT = 47  # reports/cpu-llamacpp/fc-validation-small-path.json

items, agree, exact = [], [], []
for n, path in RUNS:
    report = json.load(open(path))
    rows = report["rows"] if isinstance(report, dict) else report  # the two older files are bare row lists
    items.append(n)
    agree.append(sum(bool(r.get("agrees", r.get("agree"))) for r in rows))
    exact.append(sum(bool(r["exact"]) for r in rows))
fig, ax = plt.subplots(figsize=(6, 3.6))
ax.plot(items, agree, "o-", label="small path agrees with the cascade")
ax.plot(items, exact, "s-", label="small path exact vs gold")
ax.axhline(CASCADE_EXACT, color="grey", ls="--", label=f"the cascade exact vs gold ({CASCADE_EXACT})")
ax.set_xlabel("teacher answers distilled (one cycle, LoRA warm start)")
ax.set_ylabel("of 90 fc-train validation requests")
ax.set_ylim(30, 60)
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
ax.set_title("More distillation moved the 0.5B away from its teacher (non-AMX CPU)", fontsize=9)
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=110)
