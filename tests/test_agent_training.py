"""Chained agent conversations (the second call needs a value the first returns), the per-
conversation soft-token cache, and the small model and head trained on agent steps from a
prepared cascade (tiny random models)."""
from __future__ import annotations

import json
import math

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from hyfunc.cascade.after_results import AFTER_RESULTS_DIR, SmallWriter
from hyfunc.cascade.agent_steps import ANSWER, CALL, STEP_KINDS, _mentions, chained_steps, joined_openings
from hyfunc.cascade.agent_training import AgentTrainingConfig, agent_sft_items, sft_steps, train_agent_steps
from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.cascade.next_step_training import cache_file, encode_steps, step_key
from hyfunc.cascade.prepare import PrepareConfig, prepare
from hyfunc.cascade.retriever import Retriever
from hyfunc.cascade.small_model import load_projector
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.cascade.templating import TemplateDecoder
from hyfunc.data import FC_TRAIN
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import HyFuncMethod
from tests.test_cascade_prepare import FX, TABLE, WEATHER
from tests.tiny_models import tiny_backend


@pytest.fixture(scope="module")
def chained() -> list:
    return chained_steps(load_examples(FC_TRAIN), per_source=5, seed=0)


def test_a_chained_request_leaves_the_second_value_to_the_first_call(chained: list) -> None:
    assert len(chained) == 3 * 5 * 7  # three steps per request, 5 per source, 7 sources
    for opening, first, done in zip(chained[::3], chained[1::3], chained[2::3]):
        request = opening.messages[0]["content"]
        assert opening.messages == [opening.messages[0]] and not opening.after_results
        assert opening.label == CALL and first.label == CALL and done.label == ANSWER
        assert first.after_results and done.after_results
        assert first.messages[0]["content"] == request == done.messages[0]["content"]
        # a value of the call left: not in the request, in the first call's last result
        unstated = [v for v in first.remaining[0]["arguments"].values() if isinstance(v, str) and not _mentions(v, request)]
        assert any(v in first.messages[-1]["content"] for v in unstated), first.id
        # before any call, only the first request's calls are due
        first_calls = [c["function"] for m in first.messages for c in m.get("tool_calls") or []]
        assert [c["name"] for c in first_calls] == [c["name"] for c in opening.remaining]
        assert len(opening.origin) == 2 and opening.origin == first.origin == done.origin
    again = chained_steps(load_examples(FC_TRAIN), per_source=5, seed=0)
    assert [s.messages for s in again] == [s.messages for s in chained]  # seeded


def test_a_joined_opening_asks_for_every_call_of_both_requests(chained: list) -> None:
    examples = load_examples(FC_TRAIN)
    joined = joined_openings(examples, per_source=5, seed=0)
    assert len(joined) == 5 * 7
    by_id = {ex.id: ex for ex in examples}
    for step in joined:
        first, second = (by_id[i] for i in step.origin)
        request = step.messages[0]["content"]
        assert step.messages == [{"role": "user", "content": request}] and step.label == CALL and step.form == "joined"
        assert request.startswith(first.query.rstrip()) and request.lower().endswith(second.query.lower())
        assert [c["name"] for c in step.remaining] == [c.name for c in (*first.answers, *second.answers)]
        assert len({t.name for t in step.tools}) == len(first.tools) + len(second.tools)
    # the same joiners as chained requests: "Then" alone does not tell the two apart
    assert any(" Then " in s.messages[0]["content"] for s in joined)
    assert {s.form for s in chained} == {"chained"}


def test_small_model_items_read_the_transcript_and_target_the_calls_left(chained: list) -> None:
    small = tiny_backend()
    opening, after = chained[0], chained[1]  # one chained request: before any call, after the first's results
    items, skipped = agent_sft_items([opening, after], torch.zeros(2, 48), small, TemplateDecoder(small))
    assert skipped == 0 and [i.pattern for i in items] == ["chained_opening", "after_results"]
    first_prompt, after_prompt = (small.tokenizer.decode(i.prompt.before_ids) for i in items)
    assert "Done so far for this request" not in first_prompt
    assert "Done so far for this request" in after_prompt and after.messages[-1]["content"] in after_prompt
    # the targets: the first request's calls, then the second one's (not the first again)
    opening_target, after_target = (small.tokenizer.decode(i.target_ids) for i in items)
    assert all(c["name"] in opening_target for c in opening.remaining)
    assert all(c["name"] in after_target for c in after.remaining)
    assert after.remaining[0]["name"] not in opening_target and opening.remaining[0]["name"] not in after_target


def test_sft_steps_come_from_training_examples_only() -> None:
    examples = load_examples(FC_TRAIN)
    train, val = split_examples(examples)
    steps = sft_steps(examples, {ex.id for ex in train}, AgentTrainingConfig(per_source=5, chained_per_source=5))
    held = {ex.id for ex in val}
    assert steps and all(s.label == CALL and not (set(s.origin) & held) for s in steps)
    assert {s.after_results for s in steps} == {True, False}
    assert {s.kind for s in steps} == set(STEP_KINDS)
    after_only = sft_steps(examples, {ex.id for ex in train},
                           AgentTrainingConfig(per_source=5, chained_per_source=5, kinds=("after_results",)))
    assert after_only == [s for s in steps if s.after_results]


def test_the_soft_token_cache_keeps_one_row_per_conversation(chained: list, tmp_path) -> None:
    large = tiny_backend(hidden_size=48, seed=1)
    encoder = SoftTokenEncoder(large)
    cache = cache_file(tmp_path, large)
    first = encode_steps(encoder, chained[:3], cache)
    assert set(load_file(str(cache))) == {step_key(s) for s in chained[:3]}
    both = encode_steps(encoder, chained[:5], cache)  # two more computed, three read
    assert len(load_file(str(cache))) == 5
    assert both[:3].equal(first)
    alone = encode_steps(encoder, chained[3:5], None)
    assert both[3:].allclose(alone, atol=1e-5)


def _agent_examples() -> list[dict]:
    rows = []
    for i in range(8):
        rows.append({"id": f"w{i}", "query": f"What is the weather in Town{i}?", "tools": [WEATHER],
                     "answers": [{"name": "get_weather", "arguments": {"city": f"Town{i}"}}]})
        rows.append({"id": f"t{i}", "query": f"Book a table for {i + 2} people", "tools": [TABLE],
                     "answers": [{"name": "book table", "arguments": {"people": i + 2}}]})
        rows.append({"id": f"f{i}", "query": f"Convert {i + 5} dollars to EUR{i}", "tools": [FX],
                     "answers": [{"name": "fx.convert", "arguments": {"amount": i + 5, "to": f"EUR{i}"}}]})
    for i in range(4):
        rows.append({"id": f"ww{i}", "query": f"Weather in Town{i} and in Town{i + 1}?", "tools": [WEATHER],
                     "answers": [{"name": "get_weather", "arguments": {"city": f"Town{j}"}} for j in (i, i + 1)]})
    return rows


def _prepared(tmp_path, next_step_per_source: int):
    """A tiny cascade prepared on the agent examples: (data file, large, small, artifact)."""
    data = tmp_path / "toy.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _agent_examples()) + "\n")
    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    out = tmp_path / "artifact"
    prepare(PrepareConfig(large_model="tiny-large", small_model="tiny-small", data=[str(data)], val_fraction=0.2,
                          shard_size=4, retriever={"proj_dim": 16, "epochs": 2, "lr": 1e-2, "refusal_head": True},
                          lora_rank=4, sft_grad_accum=2, next_step_per_source=next_step_per_source, off_topic_gate=False),
            out, large=large, small=small)
    return data, large, small, out


def test_agent_training_goes_on_from_the_cascade_and_retrains_the_head(tmp_path) -> None:
    data, large, _, out = _prepared(tmp_path, next_step_per_source=4)
    adapter = (out / "adapter" / "adapter_model.safetensors").read_bytes()
    projector = (out / "projector.safetensors").read_bytes()
    config = AgentTrainingConfig(per_source=4, chained_per_source=3, max_items=12, replay=4, sft_grad_accum=2)
    record = train_agent_steps(out, [str(data)], "transformers", tmp_path / "cache", config,
                               large=large, small=tiny_backend(hidden_size=32, seed=2))
    assert record["items"]["chained_opening"] and record["items"]["after_results"] and record["items"]["single_turn_replay"]
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() != adapter
    assert (out / "projector.safetensors").read_bytes() != projector
    assert not (out / "agent_sft").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metrics"]["agent_sft"]["items"] == record["items"]
    # the head saw the chained conversations too (two after results per chained request)
    assert manifest["metrics"]["next_step"]["conversations"] > record["next_step"]["conversations"] - 1 > 0
    head = json.loads((out / "next_step" / "manifest.json").read_text())
    assert head["config"]["training"]["chained_per_source"] == 3


def test_an_after_results_model_leaves_first_requests_to_the_cascade(tmp_path) -> None:
    data, large, small, out = _prepared(tmp_path, next_step_per_source=0)
    own = {p: (out / p).read_bytes() for p in ("adapter/adapter_model.safetensors", "projector.safetensors")}
    with pytest.raises(ValueError, match="after results"):
        train_agent_steps(out, [str(data)], "transformers", tmp_path / "cache", AgentTrainingConfig(separate=True))
    config = AgentTrainingConfig(per_source=4, chained_per_source=3, max_items=12, replay=4, sft_grad_accum=2,
                                 kinds=("after_results",), separate=True)
    record = train_agent_steps(out, [str(data)], "transformers", tmp_path / "cache", config,
                               large=large, small=tiny_backend(hidden_size=32, seed=2))
    assert set(record["items"]) == {"after_results", "single_turn_replay", "skipped"} and record["items"]["after_results"]
    assert {p: (out / p).read_bytes() for p in own} == own  # the cascade's own small model is untouched
    after = out / AFTER_RESULTS_DIR
    assert (after / "adapter" / "adapter_model.safetensors").is_file() and (after / "projector.json").is_file()

    tools = parse_tools([WEATHER, TABLE, FX])
    retriever = Retriever.load(out / "retriever")
    retriever.config.refusal_threshold = -math.inf  # a call is due in both steps below
    trained = tiny_backend(hidden_size=32, seed=2)
    trained.model = PeftModel.from_pretrained(trained.model, after / "adapter").merge_and_unload().eval()
    writer = SmallWriter.of(trained, load_projector(after))
    plain = HyFuncMethod(large, small, retriever, load_projector(out))
    method = HyFuncMethod(large, small, retriever, load_projector(out), after_results=writer)
    first = [{"role": "user", "content": "Weather in city 3 and in city 4?"}]
    alone, beside = plain.answer(first, tools), method.answer(first, tools)
    assert (beside.calls, beside.raw_text) == (alone.calls, alone.raw_text) and "small_model" not in beside.details
    called = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "city 3"})}}]}
    later = method.answer(first + [called, {"role": "tool", "tool_call_id": "c1", "content": "12 degrees"}], tools)
    assert later.details["small_model"] == "after_results" and "small_decode" in later.timings
