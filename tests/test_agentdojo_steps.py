"""AgentDojo's agent conversations (hyfunc/eval/agentdojo_steps.py): the bundled file, what counts as
a right next step, and that every conversation is one the server accepts."""
import json

from pydantic import TypeAdapter

from hyfunc.cascade.agent_steps import ANSWER, CALL
from hyfunc.eval.agentdojo_steps import KINDS, load_agentdojo_steps, right, sample_after_results, step_kind
from hyfunc.formats.calls import Call
from hyfunc.formats.messages import ends_with_tool_results, follow_up_alone
from hyfunc.serving.conversation import read_conversation
from hyfunc.serving.protocol import Message


def _wire(message: dict) -> dict:
    """A step's message as an OpenAI client sends it (arguments as a JSON string)."""
    if "tool_calls" not in message:
        return message
    calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def test_bundled_steps_have_every_kind_of_every_suite_and_labels_that_fit():
    steps = load_agentdojo_steps()
    assert {(s.source, step_kind(s)) for s in steps} == {(suite, kind) for suite in ("banking", "slack", "travel", "workspace")
                                                           for kind in KINDS}
    for step in steps:
        kind = step_kind(step)
        assert step.label == (ANSWER if kind in ("answer", "follow_up_small_talk") else CALL)
        assert ends_with_tool_results(step.messages) == (kind in ("answer", "calls_left"))
        assert (follow_up_alone(step.messages) is not None) == kind.startswith("follow_up")
        names = {t.name for t in step.tools}
        assert all(c["name"] in names for c in step.remaining)
        assert bool(step.remaining) == (step.label == CALL)


def test_a_sample_takes_conversations_after_results_per_suite_seeded():
    everything = [s for s in load_agentdojo_steps() if s.after_results]
    sample = sample_after_results(per_suite=20, seed=0)
    counts = {suite: sum(s.source == suite for s in sample) for suite in ("banking", "slack", "travel", "workspace")}
    assert counts == {suite: min(20, sum(s.source == suite for s in everything)) for suite in counts}
    assert all(s.after_results for s in sample) and len({s.id for s in sample}) == len(sample)
    assert [s.id for s in sample_after_results(per_suite=20, seed=0)] == [s.id for s in sample]
    assert [s.id for s in sample_after_results(per_suite=20, seed=1)] != [s.id for s in sample]


def test_every_conversation_is_one_the_server_accepts():
    adapter = TypeAdapter(list[Message])
    for step in load_agentdojo_steps():
        conversation = read_conversation(adapter.validate_python([_wire(m) for m in step.messages]))
        assert conversation.turns[-1].role in ("user", "tool")


def test_right_next_steps():
    steps = load_agentdojo_steps()
    left = next(s for s in steps if step_kind(s) == "calls_left" and len(s.remaining) > 1)
    by_kind = {kind: next(s for s in steps if step_kind(s) == kind) for kind in ("answer", "follow_up", "follow_up_small_talk")}
    gold = [Call(c["name"], dict(c["arguments"])) for c in left.remaining]
    assert right(left, gold[:1]) and right(left, gold[1:2])  # the next call, or a later one already known
    assert not right(left, []) and not right(left, [Call(gold[0].name, {"nothing": "asked"})])
    follow_up = by_kind["follow_up"]
    first = [Call(c["name"], dict(c["arguments"])) for c in follow_up.remaining]
    assert right(follow_up, first) and not right(follow_up, [])
    for kind in ("answer", "follow_up_small_talk"):
        assert right(by_kind[kind], []) and not right(by_kind[kind], gold[:1])
