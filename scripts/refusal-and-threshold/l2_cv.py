"""The refusal head's L2 strength by five-fold cross-validation on the shipped cascade's fc-train examples (q05b split).
Run from the repository root."""
import json
from pathlib import Path
import numpy as np, torch
from hyfunc.cascade.data import load_examples, sample_by_pattern, split_examples, augment_refusals
from hyfunc.cascade.prepare import load_embeddings, retrieval_data
from hyfunc.cascade.retriever import Retriever, train_refusal_head

# The shipped cascade's training artifact (git-ignored: it holds the embedding caches). Rebuild it
# with the `hyfunc prepare` command of reports/README.md ("The shipped cascade"), about an hour here.
REPO = Path(__file__).resolve().parents[2]
art = REPO / "artifacts" / "hyfunc-q05b"
m = json.loads((art / "manifest.json").read_text())["config"]
everything = load_examples(m["data"])
examples = sample_by_pattern(everything, m["max_examples"], m["seed"])
train, val = split_examples(examples, m["val_fraction"])
train = augment_refusals(train, m["refusal_fraction"], m["seed"])
val = augment_refusals(val, m["refusal_fraction"], m["seed"] + 1)
emb = load_embeddings(art / "embeddings", {e.id for e in train + val})
print(len(train), len(val), len(emb))
rtr = Retriever.load(art / "retriever")
full = train + val
data = retrieval_data(full, emb, lexical=False)
y = np.array([1 if p else 0 for p in data.positives])
print("calls", y.sum(), "no-call", (1 - y).sum())
X = ((data.queries.float() - rtr.query_mean) / rtr.query_std)

def fit(idx, l2):
    sub = retrieval_data([full[i] for i in idx], emb, lexical=False)
    r = Retriever.load(art / "retriever")
    train_refusal_head(r, sub, l2=l2)
    return r

rng = np.random.default_rng(0)
folds = np.array_split(rng.permutation(len(full)), 5)
for l2 in [1e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0]:
    bal = []
    logits = np.zeros(len(full))
    for k in range(5):
        test = folds[k]; tr = np.concatenate([folds[j] for j in range(5) if j != k])
        r = fit(tr, l2)
        with torch.no_grad():
            logits[test] = r.refusal(X[test]).squeeze(-1).numpy()
    # balanced accuracy at threshold 0 and the AUC
    pred = logits >= 0
    ba = 0.5 * ((pred & (y == 1)).sum() / (y == 1).sum() + ((~pred) & (y == 0)).sum() / (y == 0).sum())
    pos, neg = logits[y == 1], logits[y == 0]
    auc = (pos[:, None] > neg[None, :]).mean()
    # margin: fraction of call examples with logit < 1 (thin)
    print(f"l2={l2:g}  cv balanced acc@0={ba:.3f}  auc={auc:.3f}  calls refused={(~pred & (y==1)).sum()}  no-calls answered={(pred & (y==0)).sum()}")
