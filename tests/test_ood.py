"""The out-of-distribution set (hyfunc.eval.ood): BFCL's layout and conventions, scored by bfcl-eval's
own checker, and the report per kind of value."""
import json

import pytest

from hyfunc.data import FC_TRAIN, OOD_DATA
from hyfunc.eval.bfcl import check, load_cases
from hyfunc.eval.ood import (
    HELD_OUT_SOURCES,
    KINDS,
    bfcl_doc,
    build_cases,
    case_kinds,
    first_calls_right,
    kind_markdown,
    kind_summary,
    possible_answer,
    write_bfcl_layout,
)

pytest.importorskip("bfcl_eval")

SETTINGS = {"name": "set_alarm", "description": "Set an alarm.", "parameters": {"type": "object", "properties": {
    "time": {"type": "string"},
    "repeat": {"type": "boolean", "default": False},
    "volume": {"type": "number"},
    "tone": {"type": "string", "enum": ["beep", "chime"]},
    "labels": {"type": "array", "items": {"type": "string"}},
    "snooze": {"type": "object", "properties": {"minutes": {"type": "integer"}, "times": {"type": "integer"}}},
}, "required": ["time"]}}
ALARM_LIST = {"name": "list_alarms", "description": "List alarms.", "parameters": {"type": "object", "properties": {}}}
WEATHER = {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}


def _first_accepted(entry):
    """The call a perfect model writes for one possible-answer entry."""
    def value(accepted):
        first = accepted[0]
        if isinstance(first, dict):
            return {k: value(v) for k, v in first.items()}
        if isinstance(first, list) and first and isinstance(first[0], dict):
            return [{k: value(v) for k, v in item.items()} for item in first]
        return first
    return [{name: {arg: value(v) for arg, v in args.items() if v[0] != ""}} for name, args in entry.items()]


@pytest.fixture(scope="module")
def ood_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ood")
    cases = build_cases([FC_TRAIN, OOD_DATA], HELD_OUT_SOURCES, per_source=12, seed=0)
    counts = write_bfcl_layout(cases, folder)
    return cases, counts, folder


def test_every_gold_answer_passes_bfcls_checker_and_a_wrong_one_does_not(ood_set):
    cases, counts, folder = ood_set
    assert {c.source for c in cases} == set(HELD_OUT_SOURCES)
    assert "irrelevance" in counts and sum(counts.values()) == len(cases)
    loaded = [case for category in counts for case in load_cases(category, folder)]
    assert len(loaded) == len(cases)
    for case in loaded:
        gold = [] if case.possible_answer is None else [c for entry in case.possible_answer for c in _first_accepted(entry)]
        assert check(case, gold) == (True, ""), case.id
        if case.possible_answer is None:
            some_tool = case.functions[0]["name"]
            assert check(case, [{some_tool: {}}])[0] is False  # a call where none fits
        else:
            assert check(case, [])[0] is False  # no call where one fits


def test_categories_follow_the_answers_shape(ood_set):
    cases, _, _ = ood_set
    for case in cases:
        calls, tools = len(case.ground_truth), len(case.functions)
        expected = ("irrelevance" if calls == 0 else ("simple_python" if tools == 1 else "multiple") if calls == 1
                    else "parallel" if tools == 1 else "parallel_multiple")
        assert case.category == expected


def test_possible_answers_follow_bfcls_conventions():
    call = {"name": "set_alarm", "arguments": {"time": "7:00", "repeat": False, "labels": ["work"],
                                                "snooze": {"minutes": 5, "times": 2}}}
    entry = possible_answer(call, SETTINGS)["set_alarm"]
    assert entry["time"] == ["7:00"]
    assert entry["repeat"] == [False, ""]  # the default: writing it or leaving it out are both right
    assert entry["labels"] == [["work"]]
    assert entry["snooze"] == [{"minutes": [5], "times": [2]}]
    assert entry["volume"] == [""] and entry["tone"] == [""]  # optional and not asked for
    doc = bfcl_doc(SETTINGS)
    assert doc["parameters"]["properties"]["volume"]["type"] == "float"
    assert doc["parameters"]["properties"]["snooze"]["type"] == "dict"
    assert doc["parameters"]["properties"]["snooze"]["properties"]["minutes"]["type"] == "integer"
    assert bfcl_doc(ALARM_LIST)["parameters"]["required"] == []


def test_kinds_name_the_values_asked_for():
    call = {"name": "set_alarm", "arguments": {"time": "7:00", "repeat": True, "volume": 0.5, "tone": "beep",
                                                "labels": ["a"], "snooze": {"minutes": 5}}}
    kinds = case_kinds([SETTINGS, ALARM_LIST, WEATHER], [call, call])
    assert kinds == ["bool", "enum", "list", "number", "nested_object", "free_string", "parallel", "similar_apis"]
    # set_alarm and list_alarms share "alarm"; set_alarm and get_weather only generic verbs
    assert "similar_apis" not in case_kinds([SETTINGS, WEATHER], [{"name": "get_weather", "arguments": {"city": "Oslo"}}])
    assert case_kinds([WEATHER], []) == ["irrelevance"]


def test_unknown_source_is_refused():
    with pytest.raises(Exception, match="no example of source nowhere"):
        build_cases([FC_TRAIN], ["nowhere"], per_source=2)


def test_kind_summary_tallies_and_finds_the_losses():
    kinds = {"a": {"source": "s1", "kinds": ["bool"]}, "b": {"source": "s1", "kinds": ["bool", "parallel"]},
             "c": {"source": "s2", "kinds": ["irrelevance"]}}
    main = [{"id": "a", "category": "multiple", "correct": False, "calls": [{"f": {}}],
             "error": "[value_error:others] Invalid value"},
            {"id": "b", "category": "parallel", "correct": True, "calls": [{"f": {}}]},
            {"id": "c", "category": "irrelevance", "correct": False, "calls": [{"f": {}}]},
            {"id": "not-in-set", "category": "multiple", "correct": True}]
    base = [{"id": "a", "category": "multiple", "correct": True}, {"id": "b", "category": "parallel", "correct": False},
            {"id": "c", "category": "irrelevance", "correct": True}]
    summary = kind_summary({"cascade": main, "direct": base}, kinds, "cascade", "direct")
    assert summary["kinds"]["bool"]["cascade"] == {"n": 2, "correct": 1, "accuracy": 0.5,
                                                   "misses": {"value_error:others": 1}}
    assert summary["kinds"]["overall"]["direct"]["correct"] == 2
    assert summary["sources"]["s2"]["cascade"]["misses"] == {"called a tool": 1}
    assert summary["lost_ids"] == ["a", "c"] and summary["gained_ids"] == ["b"]
    assert summary["against_main"] == {"direct": {"only_main_right": 1, "only_this_right": 2}}
    assert summary["lost_to_baseline"]["bool"] == {"value_error:others": 1}
    assert summary["kinds_at_least_baseline"] == ["bool", "parallel"]
    assert set(summary["kinds"]) == {*KINDS, "overall"}
    table = kind_markdown(summary)
    assert "| bool | 50.0 (1/2) | 50.0 (1/2) |" in table and "| enum | – | – |" in table


def test_agentdojo_tasks_are_in_the_package_and_state_their_values():
    rows = [json.loads(line) for line in (OOD_DATA / "agentdojo.jsonl").read_text().splitlines()]
    assert len(rows) == 80 and {r["source"] for r in rows} == {"agentdojo"}
    for row in rows:
        (call,) = row["answers"]
        assert call["name"] in {t["name"] for t in row["tools"]}
        for value in call["arguments"].values():
            for item in value if isinstance(value, list) else [value]:
                assert str(item).lower() in row["query"].lower()


def test_first_call_right_scores_the_first_call_of_a_longer_answer(ood_set):
    cases, _, folder = ood_set
    single = next(c for c in cases if c.category == "multiple")
    (gold,) = _first_accepted(single.ground_truth[0])
    other = next(f["name"] for f in single.functions if f["name"] not in single.ground_truth[0])
    records = {"goes on": [{"id": single.id, "calls": [gold, {other: {}}]}],
               "wrong first": [{"id": single.id, "calls": [{other: {}}, gold]}],
               "parallel ignored": [{"id": c.id, "calls": []} for c in cases if c.category == "parallel_multiple"][:1]}
    tallies = first_calls_right(records, folder)
    assert tallies["goes on"] == {"n": 1, "correct": 1, "ids": [single.id]}
    assert tallies["wrong first"]["correct"] == 0 and tallies["parallel ignored"]["n"] == 0
