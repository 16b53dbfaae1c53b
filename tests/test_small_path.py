"""The small path: a MiniLM + BM25 selector trained and calibrated on fc-train (real MiniLM), and
the small model writing through the templating decoder after it, with no large-model pass."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from hyfunc.formats.schema import parse_tools
from hyfunc.methods.small import NEAR_FIT_MARGIN, SmallMethod
from hyfunc.models.minilm import MiniLMEmbedder
from hyfunc.cascade.selector import ToolSelector, identity_selector, prepare_selector
from hyfunc.data import FC_TRAIN
from hyfunc.routing.mining import method_small_path
from tests.test_serve_sdk import TOOLS
from tests.tiny_models import tiny_backend

WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def fc_subset(directory: Path, n: int, seed: int = 0) -> Path:
    """n fc-train examples (all sources, seeded) in one JSON Lines file: a quick training set."""
    examples = [json.loads(line) for p in sorted(FC_TRAIN.glob("*.jsonl"))
                for line in p.read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(examples)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "subset.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples[:n]))
    return directory


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def selector_dir(tmp_path_factory: pytest.TempPathFactory, embedder: MiniLMEmbedder) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("selector")
    data = fc_subset(root / "data", 160)
    _, metrics = prepare_selector([str(data)], root / "selector", embedder=embedder, options={"epochs": 10})
    return root / "selector", metrics


def test_selector_is_trained_and_calibrated_on_fc_train(selector_dir: tuple[Path, dict], embedder: MiniLMEmbedder) -> None:
    directory, metrics = selector_dir
    assert metrics["train_examples"] > 100 and metrics["validation_examples"] >= 15
    assert metrics["loss_history"][-1] < metrics["loss_history"][0] / 2
    # Short fc-train lists: the gold tools rank near the top on requests it never trained on.
    assert metrics["validation"]["recall@3"] >= 0.75, metrics["validation"]
    selector = ToolSelector.load(directory, embedder)
    config = selector.retriever.config
    assert config.lexical_weight == metrics["lexical_fit"]["lexical_weight"]
    assert config.refusal_threshold == metrics["calibration"]["refusal_threshold"]
    tools = parse_tools(TOOLS)
    scores, _ = selector.rank(WEATHER[0]["content"], tools)
    assert int(scores.argmax()) == 0  # get_weather
    assert selector.select(WEATHER[0]["content"], []) == []
    with pytest.raises(ValueError, match="calibrated on"):
        ToolSelector.load(directory, embedder=type("Other", (), {"name": "other"})())


def test_identity_selector_is_minilm_cosine(embedder: MiniLMEmbedder) -> None:
    selector = ToolSelector(identity_selector(), embedder)
    tools = parse_tools(TOOLS)
    scores, answerable = selector.rank("Book a table for four people at 8 pm", tools)
    vectors = selector.vectors(tools)
    query = embedder.embed(["Book a table for four people at 8 pm"])[0]
    expected = vectors.numpy() @ query
    assert scores.numpy() == pytest.approx(expected, abs=1e-5)  # no lexical weight before calibration
    assert answerable == pytest.approx(float(expected.max()), abs=1e-5) and int(scores.argmax()) == 2


def test_small_method_answers_without_a_large_model(selector_dir: tuple[Path, dict], embedder: MiniLMEmbedder) -> None:
    selector = ToolSelector.load(selector_dir[0], embedder)
    selector.retriever.config.refusal_threshold = -1.0  # answer everything (the tiny model is random)
    method = SmallMethod(tiny_backend(32, seed=2), selector, version="v1")
    tools = parse_tools(TOOLS)
    answer = method.answer(WEATHER, tools)
    assert method.name == "small@v1" and answer.details["path"] == "small"
    assert answer.details["retrieved"][0] == "get_weather" and answer.calls
    assert {c.name for c in answer.calls} <= set(answer.details["retrieved"])
    assert set(answer.timings) == {"select", "small_prefill", "small_decode"} and answer.injected_tokens > 0
    # Its own confidence: the least certain generated token (a random model is unsure somewhere).
    assert 0.0 < answer.details["confidence"] < 1.0
    again = method.answer(WEATHER, tools)
    assert again.calls == answer.calls and again.cached_tokens > 0  # instruction + same tools not run again
    # Stopping below a confidence floor: at the floor nothing changes, above it no calls.
    kept = method.answer(WEATHER, tools, give_up_below=answer.details["confidence"])
    assert kept.calls == answer.calls and "gave_up" not in kept.details
    stopped = method.answer(WEATHER, tools, give_up_below=answer.details["confidence"] + 1e-6)
    assert stopped.details["gave_up"] and stopped.calls == [] and stopped.output_tokens <= answer.output_tokens

    # Tools left out within NEAR_FIT_MARGIN of the selection threshold nearly fit, and the small
    # path's output for mining and replay carries them.
    ranked = dict(zip(answer.details["ranking"], answer.details["scores"]))
    runner_up = sorted(ranked.values())[-2]
    # (the shown scores are rounded to 4 decimals: the edges are set 1e-3 either side of them)
    selector.retriever.config.threshold = runner_up + NEAR_FIT_MARGIN - 1e-3  # only the best tool is kept
    edge = method.answer(WEATHER, tools)
    assert edge.details["retrieved"] == ["get_weather"]
    assert edge.details["near_fit"] == [n for n, s in ranked.items() if n != "get_weather" and s >= runner_up - 1e-3]
    assert edge.details["near_fit"]
    assert method_small_path(method)(WEATHER, TOOLS).near_fit == tuple(edge.details["near_fit"])
    selector.retriever.config.threshold = runner_up + NEAR_FIT_MARGIN + 0.01
    assert method.answer(WEATHER, tools).details["near_fit"] == []

    selector.retriever.config.refusal_threshold = 10.0  # above any cosine: no tool fits
    refused = method.answer(WEATHER, tools)
    assert refused.calls == [] and set(refused.timings) == {"select"}  # the small model was not run
    with pytest.raises(ValueError, match="no user message"):
        method.answer([{"role": "system", "content": "x"}], tools)
