"""The relevance check: a cross-encoder (real all-MiniLM-L6-v2 + LoRA) trained on fc-train pairs, its
threshold placed on the validation split, saved and loaded; in the cascade it refuses a first request
when no selected tool reaches the threshold, and stays out of the steps after tool results."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from hyfunc.cascade.data import Example, load_examples, split_examples
from hyfunc.cascade.relevance import (
    RelevanceConfig,
    RelevanceModel,
    _base_model,
    add_relevance,
    relevance_pairs,
    tool_text,
    train_relevance,
)
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import CascadeOptions
from tests.serve_app import tiny_cascade
from tests.test_serve_sdk import TOOLS
from tests.test_small_path import fc_subset

WEATHER = [{"role": "user", "content": "What's the weather in Oslo?"}]


def test_tool_text_names_the_tool_its_description_and_parameters() -> None:
    tool = parse_tools(TOOLS)[0]
    text = tool_text(tool)
    assert text.startswith(f"{tool.name}: {tool.description.strip()}")
    assert all(name in text for name in tool.parameters)


def test_pairs_label_called_tools_relevant_and_the_rest_not() -> None:
    tools = parse_tools(TOOLS)
    called, other = tools[0], tools[1]
    request = Example("a", "src", "Weather in Oslo?", [called, other], [Call(called.name, {"city": "Oslo"})])
    small_talk = Example("b", "chat", "How are you?", [], [])
    pairs = relevance_pairs([request], [small_talk], seed=0)
    labels = {(q, t.name): y for q, t, y in pairs}
    assert labels[("Weather in Oslo?", called.name)] == 1.0
    assert labels[("Weather in Oslo?", other.name)] == 0.0  # offered, not called: a near miss
    assert [y for q, _, y in pairs if q == "How are you?"] == [0.0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[RelevanceModel, list[Example]]:
    data = fc_subset(tmp_path_factory.mktemp("relevance") / "data", 40)
    train, val = split_examples(load_examples([data]), val_fraction=0.3)
    model = train_relevance(train[:12], val, [], RelevanceConfig(epochs=1, max_false_refusals=0.25))
    return model, val


def test_threshold_is_the_quantile_of_the_validation_gold_tools(trained: tuple[RelevanceModel, list[Example]]) -> None:
    model, val = trained
    callers = [e for e in val if e.answers]
    best = [model.best(e.query, [t for t in e.tools if t.name in {c.name for c in e.answers}]) for e in callers]
    assert model.config.threshold == pytest.approx(float(np.quantile(best, 0.25)), abs=1e-5)
    refused = sum(b < model.config.threshold for b in best)
    assert 0 < refused <= math.ceil(0.25 * len(best))
    assert model.config.metrics["validation_call_requests"] == len(callers)
    assert model.best("anything", []) == float("-inf") and model.refuses("anything", [])


def test_saved_model_loads_with_the_same_logits(trained: tuple[RelevanceModel, list[Example]], tmp_path: Path) -> None:
    model, val = trained
    model.save(tmp_path / "relevance")
    loaded = RelevanceModel.load(tmp_path / "relevance")
    example = next(e for e in val if e.answers)
    np.testing.assert_allclose(loaded.logits(example.query, example.tools), model.logits(example.query, example.tools),
                               atol=1e-4)
    assert loaded.config.threshold == model.config.threshold
    with pytest.raises(FileNotFoundError, match="not a saved relevance model"):
        RelevanceModel.load(tmp_path)


def _with_threshold(threshold: float) -> RelevanceModel:
    model, tokenizer = _base_model()  # its head untrained: the threshold alone decides here
    return RelevanceModel(model, tokenizer, RelevanceConfig(threshold=threshold))


def test_cascade_refuses_when_no_selected_tool_reaches_the_threshold() -> None:
    tools = parse_tools(TOOLS)
    cascade = tiny_cascade()
    plain = cascade.answer(WEATHER, tools)
    assert plain.calls
    cascade.relevance = _with_threshold(math.inf)
    refused = cascade.answer(WEATHER, tools)
    assert refused.calls == [] and refused.details["refused_by"] == "relevance"
    assert "relevance" in refused.timings and "small_prefill" not in refused.timings
    # the ablation without the check answers as before
    unchecked = cascade.variant(CascadeOptions(relevance=False), "no-relevance").answer(WEATHER, tools)
    assert unchecked.calls == plain.calls
    cascade.relevance = _with_threshold(-math.inf)
    kept = cascade.answer(WEATHER, tools)
    assert kept.calls == plain.calls and isinstance(kept.details["relevance"], float)


def test_the_check_stays_out_of_the_steps_after_tool_results() -> None:
    from hyfunc.cascade.next_step import NextStepConfig, NextStepHead
    import torch

    tools = parse_tools(TOOLS)
    cascade = tiny_cascade()
    cascade.relevance = _with_threshold(math.inf)
    # a head that always finds a call due (threshold above any probability)
    hidden = cascade.large.hidden_size
    cascade.next_step = NextStepHead(torch.zeros(hidden), torch.zeros(()), torch.zeros(hidden), torch.ones(hidden),
                                     NextStepConfig(threshold=2.0))
    call = {"id": "c0", "type": "function", "function": {"name": tools[0].name, "arguments": json.dumps({"city": "Oslo"})}}
    messages = [*WEATHER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c0", "content": "12 degrees"}]
    answer = cascade.answer(messages, tools)
    assert answer.details["next_step"] == "call" and "relevance" not in answer.details and answer.calls


def test_add_relevance_records_its_data_in_the_cascade_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hyfunc.cascade import relevance

    artifact = tmp_path / "cascade"
    artifact.mkdir()
    (artifact / "manifest.json").write_text(json.dumps({"format": "hyfunc-cascade", "config": {}, "metrics": {}}))
    data = fc_subset(tmp_path / "data", 30)
    monkeypatch.setattr(relevance, "OFF_TOPIC_PAIRS", 8)
    metrics = add_relevance(artifact, [str(data)], config=RelevanceConfig(epochs=1))
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["config"]["relevance"] is True and manifest["metrics"]["relevance"] == metrics
    assert metrics["data"]["paths"] == [str(data)] and len(metrics["data"]["sha256"]) == 64
    assert RelevanceModel.load(artifact / "relevance").config.threshold == metrics["threshold"]
