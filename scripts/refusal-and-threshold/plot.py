"""comparison.png from heads.json (heads.py) and the end-to-end threshold curve in the shipped retriever's manifest."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "reports" / "refusal-and-threshold"
heads = json.loads((OUT / "heads.json").read_text())["heads"]
end_to_end = json.loads((REPO / "hyfunc/data/cascade/retriever/manifest.json").read_text())["meta"]["metrics"]["end_to_end"]
fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
categories = list(next(iter(heads.values()))["bfcl_refused_percent"])
width = 0.8 / len(heads)
for i, (name, head) in enumerate(heads.items()):
    left.bar([c + i * width for c in range(len(categories))], [head["bfcl_refused_percent"][c] for c in categories], width, label=name)
left.set_xticks([c + 0.4 - width / 2 for c in range(len(categories))], categories, rotation=40, ha="right", fontsize=8)
left.set_ylabel("% of BFCL cases refused (n = 25 per category)")
left.set_title("Refusal-head variants (fitted and calibrated on fc-train)")
left.legend(fontsize=7)
t, counts = zip(*end_to_end["curve"])
right.step(t, [c / end_to_end["requests"] for c in counts], where="post", label="calls exactly right (small model, end to end)")
right.axvline(end_to_end["retrieval_threshold"], color="grey", ls="--", lw=1, label=f"by exact tool set: t = {end_to_end['retrieval_threshold']:.2f}")
right.axvline(end_to_end["threshold"], color="red", ls="--", lw=1, label=f"end to end (shipped): t = {end_to_end['threshold']:.2f}")
right.set_xlim(0, 4)
right.set_xlabel("keep threshold t (cosine + 3 × lexical)")
right.set_title(f"fc-train validation, {end_to_end['requests']} requests with calls")
right.legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "comparison.png", dpi=110)
