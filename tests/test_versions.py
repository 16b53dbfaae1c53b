"""The gated update: a regressing candidate is refused (with reasons), versions are kept,
promotion and rollback move the champion, and rollback restores the earlier routing exactly."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hyfunc.routing.evaluate import replay
from hyfunc.routing.mining import mine
from hyfunc.routing.router import Router, train_router_from_store
from hyfunc.routing.store import Query, encode
from hyfunc.routing.stores import open_store
from hyfunc.routing.versions import GateConfig, Metrics, VersionError, Versions, gate
from tests.fc_traffic import ExtractiveSmallPath, load_examples, served_from_example

T0, N, SPLIT = 1_700_000_000.0, 300, 220


def test_gate_reasons() -> None:
    champion = Metrics(agreement=0.98, share=0.5, mean_latency=0.4, accuracy=0.90)
    assert gate(None, champion).promote
    assert gate(champion, Metrics(0.978, 0.6, 0.3, 0.895)).promote  # within tolerances, faster
    worse = gate(champion, Metrics(0.95, 0.7, 0.5, 0.85))
    assert not worse.promote and len(worse.reasons) == 3
    assert any("agreement" in r for r in worse.reasons) and any("latency" in r for r in worse.reasons)
    assert not gate(champion, Metrics(0.99, 0.5, 0.4, None)).promote  # must be scored on the holdout
    assert gate(champion, Metrics(0.98, 0.5, 0.42, 0.9), GateConfig(latency_tolerance=0.1)).promote
    # The small path alone on the labelled set: a student that copied its teacher's mistakes is refused.
    scored = Metrics(0.98, 0.5, 0.4, 0.9, small_accuracy=0.55)
    assert gate(scored, Metrics(0.98, 0.6, 0.3, 0.9, small_accuracy=0.545)).promote
    copied = gate(scored, Metrics(0.99, 0.6, 0.3, 0.9, small_accuracy=0.48))
    assert not copied.promote and any("labelled set" in r for r in copied.reasons)
    assert not gate(scored, Metrics(0.99, 0.6, 0.3, 0.9)).promote  # must be scored there too


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory):
    examples = load_examples(N, seed=1)
    path = tmp_path_factory.mktemp("cycle") / "traffic.sqlite"
    with open_store(path) as store:
        requests = [served_from_example(ex, i, T0) for i, ex in enumerate(examples)]
        for r in requests:
            r.timings = {"large": 2.0, "small": 0.3}  # what serving through the cascade cost
        store.write([encode(r) for r in requests])
        small = ExtractiveSmallPath(examples)
        mine(store, small, small_path_name="extractive")  # scalar features only: fast, no embedder
        gold = {r.request_id: ex["answers"] for r, ex in zip(requests, examples)}
        yield store, small, gold


def _save(router: Router):
    return lambda directory: router.save(directory)


def test_refused_regression_and_exact_rollback(traffic, tmp_path: Path) -> None:
    store, small, gold = traffic
    held = Query(since=T0 + SPLIT)
    versions = Versions(tmp_path / "odia")

    def measure(router: Router):
        return replay(store, lambda m, t, _: router.route(m, t), small, held, gold)

    first = train_router_from_store(store, Query(until=T0 + SPLIT), target=0.97)
    v1, verdict = versions.consider(_save(first), measure(first))
    assert verdict.promote and versions.champion == v1 and versions.previous is None

    # A candidate trained for a looser target sends more to the small path: faster, slightly less
    # agreement (and accuracy: gold = the large answer here); promoted within these loose tolerances.
    second = train_router_from_store(store, Query(until=T0 + SPLIT), target=0.9)
    m1, m2 = versions.metrics(v1), measure(second)
    v2, verdict2 = versions.consider(_save(second), m2, GateConfig(agreement_tolerance=0.2, accuracy_tolerance=0.2))
    assert verdict2.promote and m2.share >= m1.share and versions.champion == v2 and versions.previous == v1

    # A deliberately broken candidate: routes everything to the small path.
    broken = Router.load(versions.path(v2))
    broken.threshold = -1.0
    broken.manifest["threshold"] = -1.0
    mb = measure(broken)
    assert mb.share == 1.0 and mb.agreement < versions.metrics(v2).agreement - 0.005
    v3, verdict3 = versions.consider(_save(broken), mb)
    assert not verdict3.promote and any("agreement" in r for r in verdict3.reasons)
    assert versions.champion == v2  # refused: the champion stays
    assert versions.manifest(v3)["parents"] == [v2] and "agreement" in versions.manifest(v3)["note"]
    assert [m["id"] for m in versions.list()] == [v1, v2, v3]  # every version kept

    # Rollback restores the previous version's routing exactly.
    requests = [s.request for s in store.iter_requests(held)]

    def decisions(vid: str) -> list[str]:
        router = Router.load(versions.path(vid))
        return [router.route(r.messages, r.tools) for r in requests]

    before = decisions(v1)
    assert versions.rollback() == v1 and versions.champion == v1
    assert decisions(versions.champion) == before
    assert json.loads((versions.path(v1) / "router.json").read_text())["threshold"] == first.threshold
    with pytest.raises(VersionError, match="nothing to roll back"):
        versions.rollback()


def test_status_and_rollback_commands(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from hyfunc.cli import main

    versions = Versions(tmp_path / "odia")
    a = versions.create(lambda d: None, metrics=Metrics(0.99, 0.4, 0.5, None), parents=[])
    b = versions.create(lambda d: None, metrics=Metrics(0.99, 0.6, 0.3, 0.9), parents=[a])
    versions.promote(a)
    versions.promote(b)
    assert main(["odia", "status", "--dir", str(versions.root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{a}  previous") and lines[1].startswith(f"{b}  champion") and "60.0%" in lines[1]
    assert main(["odia", "rollback", "--dir", str(versions.root)]) == 0
    assert versions.champion == a and capsys.readouterr().out.strip() == f"champion -> {a}"
    assert main(["odia", "rollback", "--dir", str(versions.root)]) == 2
    assert capsys.readouterr().err.startswith("error: nothing to roll back")
    assert main(["odia", "status", "--dir", str(tmp_path / "none")]) == 2


def test_replay_metrics(traffic) -> None:
    store, small, gold = traffic
    held = Query(since=T0 + SPLIT)
    n = len(list(store.iter_requests(held)))
    everything_large = replay(store, lambda m, t, _: "large", small, held, gold)
    assert (everything_large.agreement, everything_large.share, everything_large.accuracy) == (1.0, 0.0, 1.0)
    assert everything_large.mean_latency == pytest.approx(2.3, abs=0.01)
    everything_small = replay(store, lambda m, t, _: "small", small, held, gold)
    labels = {s.request.request_id: l.simple for s, l in store.iter_labels(held)}
    assert everything_small.agreement == pytest.approx(np.mean(list(labels.values())))
    assert everything_small.share == 1.0 and everything_small.mean_latency < 0.01 and len(labels) == n
