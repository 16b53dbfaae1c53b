"""A cycle without distillation: the cascade's own small path (its adapter + the shipped selector)
mined on a cycle's training window, and a small-first router trained on those labels for 85 %
agreement; saved as a version-like directory for scripts/small_path_agreement.py.

    python scripts/router_without_distillation.py traffic.sqlite <version>/cycle.json out-dir

The window is the cycle's (requests logged before its held-out part), so the two are compared on
the same traffic (reports/cpu-llamacpp/odia-distil-scale/).
"""
import json
import shutil
import sys
from pathlib import Path

from hyfunc.cascade.selector import default_selector_dir
from hyfunc.methods.cascade import DEFAULT_ARTIFACT
from hyfunc.routing.mining import method_small_path, mine
from hyfunc.routing.routed import (
    SMALL_MANIFEST,
    SharedEmbedder,
    load_small,
    small_description,
)
from hyfunc.routing.router import RoutingExample, train_router
from hyfunc.routing.store import Query
from hyfunc.routing.stores import open_store

store_path, cycle_json, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
held_since = json.loads(Path(cycle_json).read_text())["window"]["held_out_since"]
art = Path(DEFAULT_ARTIFACT)
base = json.loads((art / "manifest.json").read_text())["small_model"]
small_dir = out / "small"
small_dir.mkdir(parents=True, exist_ok=True)
shutil.copytree(art / "adapter", small_dir / "adapter", dirs_exist_ok=True)
shutil.copytree(default_selector_dir(), small_dir / "selector", dirs_exist_ok=True)
(small_dir / SMALL_MANIFEST).write_text(json.dumps(small_description(base, adapter=True)))
embedder = SharedEmbedder()
small = load_small(small_dir, embedder, "auto", version="undistilled")
labels = []
with open_store(store_path) as store:
    query = Query(until=held_since, without_error=True)
    report = mine(store, method_small_path(small), small_path_name="undistilled", embedder=embedder, query=query,
                  relabel=True, save=labels.extend)
    created = {s.request.request_id: s.request.created for s in store.iter_requests(query)}
print("mining", report.labelled, report.simple, report.simple_share)
examples = [RoutingExample(label.features, None, label.simple, created[label.request_id]) for label in labels]
router = train_router(examples, target=0.85, use_small_answer=True, embedder=embedder, embedder_name=None,
                      window={"since": None, "until": held_since})
router.save(out / "router")
print("router", router.threshold, json.dumps(router.manifest["calibration"]))
