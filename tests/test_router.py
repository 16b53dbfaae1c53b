"""Router: threshold selection, and a router learned from mined fc-train traffic (real MiniLM
embeddings, the ExtractiveSmallPath rule of fc_traffic.py) judged on *later* traffic it never saw."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from hyfunc.cli import main
from hyfunc.formats.calls import Call, same_calls
from hyfunc.models.minilm import MiniLMEmbedder
from hyfunc.routing.mining import mine
from hyfunc.routing.router import (
    Router, RouterError, RoutingExample, choose_threshold, tradeoff_curve, train_router, train_router_from_store,
)
from hyfunc.routing.store import Query, encode
from hyfunc.routing.stores import open_store
from tests.fc_traffic import ExtractiveSmallPath, load_examples, served_from_example
from tests.test_serve_sdk import TOOLS

CALL = {"name": "get_weather", "arguments": {"city": "word"}}  # grounded in the requests below

N, N_TEST, T0 = 400, 100, 1_700_000_000.0


def test_threshold_is_the_largest_share_meeting_the_target() -> None:
    scores = np.array([0.9, 0.8, 0.8, 0.7, 0.6, 0.2])
    simple = np.array([1, 1, 0, 1, 0, 0], dtype=bool)
    curve = tradeoff_curve(scores, simple)
    # The tie at 0.8 is one cut: 0 / 1 / 3 / 4 / 5 / 6 requests routed.
    assert [round(p.share * 6) for p in curve] == [0, 1, 3, 4, 5, 6]
    assert choose_threshold(curve, 0.99).threshold == 0.9
    high = choose_threshold(curve, 0.8)
    assert (high.threshold, high.share, high.agreement) == (0.7, 4 / 6, 5 / 6)
    assert choose_threshold(curve, 0.75, metric="precision").threshold == 0.7
    nothing = choose_threshold(tradeoff_curve(np.array([0.4]), np.array([False])), 0.99)
    assert nothing.share == 0.0 and nothing.threshold > 0.4  # routes nothing, not even the top score


def test_confidence_floor_is_where_the_small_first_router_stops_routing() -> None:
    """A decode may stop once its running minimum falls below the floor: the router would have
    escalated any answer with that confidence, whatever its call count (1 to max_calls)."""
    from hyfunc.routing.features import scalar_features

    rng = np.random.default_rng(0)
    examples = []
    for i in range(200):
        words, calls, confidence = int(rng.integers(3, 60)), int(rng.integers(1, 4)), float(rng.uniform())
        messages = [{"role": "user", "content": " ".join(["word"] * words)}]
        features = scalar_features(messages, TOOLS, [{}] * calls, confidence)
        simple = confidence + 0.2 * rng.normal() > 0.5 + words / 200
        examples.append(RoutingExample(features, None, bool(simple), float(i)))
    router = train_router(examples, target=0.95, use_small_answer=True)
    assert router.needs_small_answer and router.weight[router.scalars.index("small_confidence")] > 0
    for words in (5, 25, 50):
        messages = [{"role": "user", "content": " ".join(["word"] * words)}]
        floor = router.confidence_floor(messages, TOOLS, max_calls=4)
        assert 0.0 < floor < 1.0, (words, floor)
        above = [router.route(messages, TOOLS, [CALL] * k, floor + 1e-6) for k in range(1, 5)]
        below = [router.route(messages, TOOLS, [CALL] * k, floor - 1e-6) for k in range(1, 5)]
        assert "small" in above and set(below) == {"large"}, (words, floor, above, below)
        assert router.route(messages, TOOLS, [CALL], 1.0, gave_up=True) == "large"
    router.threshold = 1.0  # routes nothing: give up at once
    assert router.confidence_floor([{"role": "user", "content": "hi"}], TOOLS) == float("inf")
    without = train_router(examples, target=0.95)  # reads no confidence: never stops a decode
    assert without.confidence_floor([{"role": "user", "content": "hi"}], TOOLS) == 0.0


def test_training_refuses_what_it_cannot_learn() -> None:
    few = [RoutingExample({"request_chars_log": 1.0, "request_words_log": 1.0, "turns": 1.0, "tools_log": 1.0},
                          None, True, float(i)) for i in range(10)]
    with pytest.raises(RouterError, match="only 10 labelled"):
        train_router(few)
    with pytest.raises(RouterError, match="all 28 training requests are simple"):
        train_router(few * 4)


@pytest.fixture(scope="module")
def mined(tmp_path_factory: pytest.TempPathFactory):
    examples = load_examples(N, seed=0)
    path = tmp_path_factory.mktemp("router") / "traffic.sqlite"
    embedder = MiniLMEmbedder()
    small = ExtractiveSmallPath(examples)
    with open_store(path) as store:
        store.write([encode(served_from_example(ex, i, T0)) for i, ex in enumerate(examples)])
        report = mine(store, small, small_path_name="extractive", embedder=embedder)
        yield store, examples, small, embedder, report


def test_mining_fc_traffic(mined) -> None:
    store, examples, small, _, report = mined
    assert report.labelled == N and report.small_failures == 0
    assert 0.2 < report.simple_share < 0.7  # a mix: neither label is trivial
    by_query = {ex["query"]: ex for ex in examples}
    for stored, label in store.iter_labels():
        ex = by_query[stored.request.messages[0]["content"]]
        out = small(stored.request.messages, stored.request.tools)
        expected = same_calls([Call(c["name"], c["arguments"]) for c in out.calls],
                              [Call(c["name"], c["arguments"]) for c in ex["answers"]])
        assert label.simple == expected
        assert label.embedder == "all-MiniLM-L6-v2" and len(label.embedding) == 384
        assert abs(np.linalg.norm(label.embedding) - 1.0) < 1e-4


def _auc(scores: np.ndarray, y: np.ndarray) -> float:
    pos, neg = scores[y], scores[~y]
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


@pytest.mark.parametrize("use_small_answer", [False, True])
def test_router_generalises_to_later_traffic(mined, tmp_path: Path, use_small_answer: bool) -> None:
    store, _, _, embedder, _ = mined
    split = T0 + (N - N_TEST)
    router = train_router_from_store(store, Query(until=split), target=0.95, use_small_answer=use_small_answer,
                                     embedder=embedder)
    cal = router.manifest["calibration"]
    assert cal["agreement"] >= 0.95 and cal["n"] == 90 and router.manifest["trained"]["n"] == 210
    assert len(router.manifest["curve"]) >= 10 and router.manifest["curve"][0]["share"] == 0.0

    test = list(store.iter_labels(Query(since=split)))
    assert len(test) == N_TEST
    feats = [label.features for _, label in test]
    emb = np.array([label.embedding for _, label in test])
    y = np.array([label.simple for _, label in test])
    scores = router.scores(feats, emb)
    routed = scores >= router.threshold
    agreement, share = 1.0 - float(np.mean(routed & ~y)), float(routed.mean())
    # Learned, not guessed: ranks later traffic well, and the held-out threshold transfers.
    assert _auc(scores, y) > 0.8
    assert agreement >= 0.9 and share >= 0.15, (agreement, share)

    loaded = Router.load(router.save(tmp_path / "router"), embedder=embedder)
    assert np.array_equal(loaded.scores(feats, emb), scores)
    stored, label = test[0]
    request = stored.request
    small_calls = label.small_calls if use_small_answer else None
    confidence = label.features.get("small_confidence") if use_small_answer else None
    score = loaded.score(request.messages, request.tools, small_calls, confidence)
    assert score == pytest.approx(scores[0], abs=1e-5)  # serving recomputes the mined features
    expected = "small" if score >= loaded.threshold else "large"
    assert loaded.route(request.messages, request.tools, small_calls, confidence) == expected
    if use_small_answer:
        with pytest.raises(RouterError, match="small path's answer"):
            loaded.score(request.messages, request.tools)
    started = time.perf_counter()
    for _ in range(100):
        loaded.scores(feats[:1], emb[:1])
    assert (time.perf_counter() - started) / 100 < 0.005  # the classifier itself: well under 5 ms


def test_cli_trains_a_router(mined, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = mined[0]
    out = tmp_path / "r"
    assert main(["odia", "train-router", "--store", store.url, "--out", str(out), "--target", "0.97"]) == 0
    assert "to the small path at" in capsys.readouterr().out
    router = Router.load(out)
    assert router.manifest["target"] == 0.97 and router.embedder_name == "all-MiniLM-L6-v2"
    assert main(["odia", "train-router", "--store", str(tmp_path / "none.sqlite"), "--out", str(out)]) == 2


def test_a_small_answer_with_a_value_the_request_does_not_give_goes_to_the_large_path() -> None:
    """Whatever its score: the small model copies words, and the description asks for more."""
    from tests.odia_fixtures import length_router
    from tests.test_grounding import WEATHER

    router = length_router(threshold=0.0, small_first=True)  # every scored answer would go to the small path
    messages = [{"role": "user", "content": "Weather in Boston, MA?"}]
    copied = [{"name": "get_current_weather", "arguments": {"location": "Boston, MA"}}]
    bare = [{"name": "get_current_weather", "arguments": {"location": "Boston"}}]
    assert router.route(messages, [WEATHER], copied, 0.9) == "small"
    assert router.route(messages, [WEATHER], bare, 0.9) == "large"
    assert [u.reason for u in router.escalations(messages, [WEATHER], bare)] == ["separators"]
    assert router.escalations(messages, [WEATHER], None) == []  # nothing answered yet: nothing to check


def test_a_small_path_refusal_goes_to_the_large_path() -> None:
    """The cascade's refusal head and gate judge refusals, not the selector's cosine."""
    from hyfunc.routing.router import SMALL_REFUSED
    from tests.odia_fixtures import length_router
    from tests.test_grounding import WEATHER

    router = length_router(threshold=0.0, small_first=True)  # every scored answer would go to the small path
    messages = [{"role": "user", "content": "Weather in Boston, MA?"}]
    assert router.decide(messages, [WEATHER], [], 1.0) == ("large", None, [SMALL_REFUSED])
    assert router.route(messages, [WEATHER], [{"name": "get_current_weather", "arguments": {"location": "Boston, MA"}}],
                        1.0) == "small"


def test_one_tool_repeated_while_another_nearly_fits_goes_to_the_large_path() -> None:
    """"A musical ticket and a train ticket": the small model saw only the ticket tool the selector
    kept, so it bought two musical tickets; the cascade's retriever reads the large model's state."""
    from hyfunc.routing.router import ANOTHER_TOOL
    from tests.odia_fixtures import length_router

    router = length_router(threshold=0.0, small_first=True)  # every scored answer would go to the small path
    messages = [{"role": "user", "content": "The weather in word, then in word again"}]
    assert router.decide(messages, TOOLS, [CALL, CALL], 0.9, near_fit=["book_table"]) == (
        "large", None, [ANOTHER_TOOL.format("book_table")])
    assert router.route(messages, TOOLS, [CALL, CALL], 0.9) == "small"  # nothing else nearly fits
    assert router.route(messages, TOOLS, [CALL], 0.9, near_fit=["book_table"]) == "small"  # one call
    other = {"name": "book_table", "arguments": {}}
    assert router.route(messages, TOOLS, [CALL, other], 0.9, near_fit=["ping"]) == "small"  # two tools called
