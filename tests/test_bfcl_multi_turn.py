"""BFCL's multi-turn categories: bfcl-eval's data, its simulated APIs and its multi-turn checker
(all real); the methods are test doubles that play the ground truth, never call, or loop."""
import ast
import json

import pytest

import bfcl_eval  # noqa: F401  (the official checker must be installed: requirements/bfcl.txt)

from hyfunc.eval.bfcl import load_cases, run_eval, run_side_by_side  # noqa: E402
from hyfunc.eval.bfcl_multi_turn import (  # noqa: E402
    SimulatedApis,
    call_strings,
    evaluate_multi_turn_case,
    load_multi_turn_cases,
)
from hyfunc.formats.bfcl import MULTI_TURN_CATEGORIES, BfclError, import_bfcl  # noqa: E402
from hyfunc.formats.calls import Call  # noqa: E402
from hyfunc.formats.schema import parse_tools  # noqa: E402
from hyfunc.methods.base import Answer  # noqa: E402


def _ground_truth_call(text: str, docs: dict[str, dict]) -> Call:
    """A ground-truth call string as a Call; positional arguments named after the doc's order."""
    node = ast.parse(text, mode="eval").body
    name = node.func.id
    order = list(docs[name]["parameters"]["properties"])
    arguments = {order[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    arguments.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return Call(name, arguments)


class GroundTruthMethod:
    """Answers each turn with its ground-truth calls in one step, then stops calling."""

    name = "ground-truth"

    def __init__(self, cases):
        self.by_first_request = {c.turns[0][0]["content"]: c for c in cases}
        self.tools_seen: list[list[str]] = []

    def answer(self, messages, tools):
        self.tools_seen.append([t.name for t in tools])
        case = self.by_first_request[next(m for m in messages if m["role"] == "user")["content"]]
        if messages[-1]["role"] == "tool":
            return Answer(calls=[], raw_text="Done.")
        turn = sum(m["role"] == "user" for m in messages) - 1
        docs = {d["name"]: d for d in case.functions + [d for ds in case.added_functions.values() for d in ds]}
        calls = [_ground_truth_call(s, docs) for s in case.ground_truth[turn]]
        return Answer(calls=calls, raw_text="", timings={"decode": 0.01})


class SilentMethod:
    name = "silent"

    def answer(self, messages, tools):
        return Answer(calls=[], raw_text="I cannot do that.")


class LoopingMethod:
    """Calls `pwd` forever: bfcl-eval's step limit must end the conversation."""

    name = "looping"

    def __init__(self):
        self.steps = 0

    def answer(self, messages, tools):
        self.steps += 1
        return Answer(calls=[Call("pwd", {})])


def test_load_every_multi_turn_category():
    for category in MULTI_TURN_CATEGORIES:
        cases = load_cases(category)
        assert len(cases) == 200, category
        for case in cases[:20]:
            assert len(case.turns) == len(case.ground_truth) and case.functions and case.involved_classes
    miss = load_multi_turn_cases("multi_turn_miss_func", limit=5)
    for case in miss:
        assert case.added_functions
        for turn, docs in case.added_functions.items():
            assert case.turns[turn] == []  # the turn where the functions arrive has no user message
            assert not {d["name"] for d in docs} & {d["name"] for d in case.functions}
    with pytest.raises(BfclError, match="packaged"):
        load_cases("multi_turn_base", data_dir="somewhere")


def test_ground_truth_scores_right_and_silence_wrong(tmp_path):
    for category in MULTI_TURN_CATEGORIES:  # one category at a time: their first requests repeat across them
        cases = load_multi_turn_cases(category, limit=2)
        oracle = GroundTruthMethod(cases)
        out = {"ground-truth": tmp_path / category / "gt", "silent": tmp_path / category / "silent"}
        summaries = run_side_by_side({"ground-truth": oracle, "silent": SilentMethod()}, [category], limit=2,
                                     out_dirs=out, progress=False)
        assert summaries["ground-truth"]["overall"]["n"] == 2
        records = [json.loads(line) for line in (out["ground-truth"] / "cases.jsonl").read_text().splitlines()]
        assert [r["error"] for r in records if not r["correct"]] == []
        # every turn: the calls, their results from the simulated APIs, then a step without calls
        first = records[0]
        assert len(first["turns"]) == len(cases[0].turns)
        step = first["turns"][0][0]
        assert step["calls"] and len(step["results"]) == len(step["calls"])
        assert first["turns"][0][-1]["calls"] == [] and first["steps"] > len(cases[0].turns)
        assert summaries["silent"]["overall"]["correct"] == 0
        errors = [json.loads(line)["error"] for line in (out["silent"] / "cases.jsonl").read_text().splitlines()]
        assert all("empty_turn_model_response" in e for e in errors)
        figures = summaries["silent"]["multi_turn"][category]
        assert figures["failures"] == {"multi_turn:empty_turn_model_response": 2} and figures["calls_executed"] == 0
        assert summaries["ground-truth"]["multi_turn"][category]["failures"] == {}
        assert "Multi-turn conversations" in (out["silent"] / "results.md").read_text()
    # miss_func: the added function is offered from its turn on, not before
    case = load_multi_turn_cases("multi_turn_miss_func", limit=1)[0]
    oracle = GroundTruthMethod([case])
    turn, docs = next(iter(case.added_functions.items()))
    oracle.tools_seen.clear()
    assert evaluate_multi_turn_case(oracle, case)["correct"]
    added = docs[0]["name"]
    offered = [added in names for names in oracle.tools_seen]
    assert not offered[0] and offered[-1] and offered == sorted(offered)


def test_step_limit_ends_the_conversation(tmp_path):
    case = load_multi_turn_cases("multi_turn_base", limit=1)[0]
    method = LoopingMethod()
    record = evaluate_multi_turn_case(method, case)
    limit = import_bfcl("bfcl_eval.constants.default_prompts").MAXIMUM_STEP_LIMIT
    assert method.steps == limit + 1 and record["force_quit"]
    assert not record["correct"] and "force_terminated" in record["error"]
    # resumable: the record is on disk and not redone
    run_eval(method, ["multi_turn_base"], limit=1, out_dir=tmp_path, progress=False)
    method.steps = 0
    run_eval(method, ["multi_turn_base"], limit=1, out_dir=tmp_path, progress=False)
    assert method.steps == 0


def test_conversations_do_not_share_api_state():
    case = load_multi_turn_cases("multi_turn_base", limit=1)[0]
    first, second = SimulatedApis(case), SimulatedApis(case)
    try:
        assert first.execute(["mkdir(dir_name='made_by_first')"]) == ["None"]
        assert "made_by_first" in first.execute(["ls()"])[0]
        assert "made_by_first" not in second.execute(["ls()"])[0]
    finally:
        first.close()
        second.close()
    executor = import_bfcl("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    assert not [n for n in vars(executor) if n.startswith((first.key, second.key))]


def test_only_offered_calls_are_executed():
    tools = parse_tools([{"name": "ls", "description": "list", "parameters": {"type": "dict", "properties": {}}}])
    assert call_strings([Call("ls", {})], tools) == ["ls()"]
    assert call_strings([Call("ls", {"a": "x'); import os; ('"})], tools) == ["""ls(a="x'); import os; ('")"""]
    with pytest.raises(BfclError, match="offered"):
        call_strings([Call("__import__", {"name": "os"})], tools)
    with pytest.raises(BfclError, match="offered"):
        call_strings([Call("ls", {"a=1,b": 2})], tools)

