"""Refusal-head variants, fitted on fc-train (q05b split), calibrated on its validation split,
then applied to the BFCL soft tokens: refusal rate per category."""
import json, copy, collections
from pathlib import Path
import numpy as np, torch
from safetensors.torch import load_file
from hyfunc.cascade.data import load_examples, sample_by_pattern, split_examples, augment_refusals
from hyfunc.cascade.prepare import load_embeddings, retrieval_data
from hyfunc.cascade.retriever import Retriever, train_refusal_head, calibrate, evaluate

# The shipped cascade's training artifact (git-ignored: it holds the embedding caches). Rebuild it
# with the `hyfunc prepare` command of reports/README.md ("The shipped cascade"), about an hour here.
REPO = Path(__file__).resolve().parents[2]
art = REPO / "artifacts" / "hyfunc-q05b"
OUT = REPO / "reports" / "refusal-and-threshold"
m = json.loads((art / "manifest.json").read_text())["config"]
examples = sample_by_pattern(load_examples(m["data"]), m["max_examples"], m["seed"])
train0, val0 = split_examples(examples, m["val_fraction"])
train = augment_refusals(train0, m["refusal_fraction"], m["seed"])
val = augment_refusals(val0, m["refusal_fraction"], m["seed"] + 1)
emb = load_embeddings(art / "embeddings", {e.id for e in train + val})
soft = load_file(OUT / "bfcl_soft.safetensors")["soft"]
ids = json.load(open(OUT / "bfcl_ids.json"))
cats = [i.rsplit("_", 1)[0] if not i.startswith("live") else i.split("-")[0].rsplit("_", 1)[0] for i in ids]
shipped = Retriever.load(art / "retriever")

def report(name, r):
    with torch.no_grad():
        a = r.refusal(((soft - r.query_mean) / r.query_std)).squeeze(-1).numpy()
    refused = a < r.config.refusal_threshold
    by = collections.defaultdict(list)
    for c, x in zip(cats, refused):
        by[c].append(x)
    vd = retrieval_data(val, emb)
    ev = evaluate(r, vd)
    results[name] = {"refusal_threshold": r.config.refusal_threshold, "val_refusal_accuracy": ev["refusal_accuracy"],
                     "val_exact_set_accuracy": ev["exact_set_accuracy"], "bfcl_refused_percent": {c: float(np.mean(v) * 100) for c, v in by.items()}}
    print(f"{name:28s} thr={r.config.refusal_threshold:6.2f} val refusal_acc={ev['refusal_accuracy']:.3f} exact={ev.get('exact_set_accuracy', float('nan')):.3f} | " +
          " ".join(f"{c[:14]}={np.mean(v)*100:.0f}" for c, v in by.items()))
    return a

results = {}
report("shipped", shipped)
def variant(name, keep, l2=1e-3):
    r = copy.deepcopy(shipped)
    tr = [e for e in train if keep(e)]
    va = [e for e in val if keep(e)]
    train_refusal_head(r, retrieval_data(tr, emb, lexical=False), l2=l2)
    t = r.config.threshold
    calibrate(r, retrieval_data(va, emb))
    r.config.threshold = t
    report(name, r)
variant("refit (same data)", lambda e: True)
variant("no near-miss", lambda e: e.source != "augmented-near-miss")
variant("no unrelated", lambda e: e.source != "augmented-unrelated")
variant("refit l2=0.1", lambda e: True, 0.1)

json.dump({"heads": results}, open(OUT / "heads.json", "w"), indent=2)
