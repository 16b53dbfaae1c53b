"""BFCL evaluation: packaged data, the official checker (bfcl-eval), resume and reports.

The checker is the real `bfcl_eval` one; only the *method* is a test double here.
"""
import json
import shutil

import pytest

import bfcl_eval  # noqa: F401  (the official checker must be installed: requirements/bfcl.txt)

from hyfunc.eval import report  # noqa: E402
from hyfunc.eval.bfcl import (  # noqa: E402
    CATEGORIES,
    BfclError,
    check,
    data_files,
    load_cases,
    packaged_data_dir,
    run_eval,
    run_side_by_side,
)
from hyfunc.formats.bfcl import bfcl_prompt_messages, bfcl_system_prompt  # noqa: E402
from hyfunc.formats.calls import Call  # noqa: E402
from hyfunc.formats.schema import parse_tools  # noqa: E402
from hyfunc.methods.base import Answer  # noqa: E402

AST_CATEGORIES = [c for c in CATEGORIES if "irrelevance" not in c]
EXPECTED_COUNTS = {
    "simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200, "irrelevance": 240,
    "live_simple": 258, "live_multiple": 1053, "live_parallel": 16, "live_parallel_multiple": 24,
    "live_irrelevance": 884,
}


def _materialize(value):
    """An allowed value from a possible answer, with nested {key: [allowed...]} dicts resolved."""
    if isinstance(value, dict):
        return {
            k: (_materialize(a[0]) if isinstance(a, list) else a)
            for k, a in value.items()
            if not (isinstance(a, list) and (not a or "" in a))
        }
    if isinstance(value, list):
        return [_materialize(x) if isinstance(x, dict) else x for x in value]
    return value


def gold_output(case):
    """The possible answer turned into model output: first allowed value per argument; arguments
    whose allowed values include "" (optional) are left out unless the doc marks them required."""
    docs = {f["name"]: f for f in case.functions}
    out = []
    for call in case.possible_answer:
        for name, args in call.items():
            required = docs[name]["parameters"].get("required", [])
            chosen = {}
            for arg, allowed in args.items():
                values = [v for v in allowed if v != ""]
                if not values or ("" in allowed and arg not in required):
                    continue
                chosen[arg] = _materialize(values[0])
            out.append({name: chosen})
    return out


# ---------------------------------------------------------------------------------------------
# Data


@pytest.mark.parametrize("category", CATEGORIES)
def test_packaged_data(category):
    q, a = data_files(category)
    assert q.name == f"BFCL_v4_{category}.json"
    assert (a is None) == ("irrelevance" in category)
    cases = load_cases(category, limit=3)
    assert len(cases) == 3
    for case in cases:
        assert case.category == category
        assert case.id.startswith(category + "_")
        assert case.messages and all(set(m) == {"role", "content"} for m in case.messages)
        assert case.messages[-1]["role"] == "user"
        assert case.functions and all("name" in f and "parameters" in f for f in case.functions)
        assert (case.possible_answer is None) == ("irrelevance" in category)
        parse_tools(case.functions)  # hyfunc reads every doc


def test_full_counts():
    for category, n in EXPECTED_COUNTS.items():
        assert len(load_cases(category)) == n, category


def test_system_messages_are_kept():
    cases = load_cases("live_simple")
    with_system = [c for c in cases if c.messages[0]["role"] == "system"]
    assert with_system and all(c.messages[-1]["role"] == "user" for c in with_system)


def test_aliases_and_unknown_category():
    assert load_cases("simple", limit=1)[0].category == "simple_python"
    with pytest.raises(BfclError):
        load_cases("web_search")


def test_user_data_dir(tmp_path):
    src = packaged_data_dir()
    (tmp_path / "possible_answer").mkdir()
    # v3-style name for "simple"; a live_simple file that must not be taken for "simple_python"
    lines = (src / "BFCL_v4_simple_python.json").read_text().splitlines()[:2]
    (tmp_path / "BFCL_v3_simple.json").write_text("\n".join(lines) + "\n")
    gold = (src / "possible_answer" / "BFCL_v4_simple_python.json").read_text().splitlines()[:2]
    (tmp_path / "possible_answer" / "BFCL_v3_simple.json").write_text("\n".join(gold[::-1]) + "\n")
    shutil.copy(src / "BFCL_v4_live_simple.json", tmp_path / "my_live_simple.json")
    shutil.copy(src / "possible_answer" / "BFCL_v4_live_simple.json", tmp_path / "possible_answer" / "my_live_simple.json")
    cases = load_cases("simple_python", data_dir=tmp_path)
    assert [c.id for c in cases] == ["simple_python_0", "simple_python_1"]
    for c in cases:  # answers matched by id, not by line order
        assert check(c, gold_output(c))[0]
    assert len(load_cases("live_simple", data_dir=tmp_path)) == EXPECTED_COUNTS["live_simple"]
    with pytest.raises(BfclError, match="parallel"):
        load_cases("parallel", data_dir=tmp_path)


# ---------------------------------------------------------------------------------------------
# The official checker


@pytest.mark.parametrize("category", AST_CATEGORIES)
def test_checker_accepts_possible_answer(category):
    for case in load_cases(category, limit=8):
        ok, err = check(case, gold_output(case))
        assert ok, (case.id, err)


def test_checker_rejects_wrong_answers():
    case = load_cases("simple_python", limit=1)[0]
    gold = gold_output(case)
    name = next(iter(gold[0]))
    args = dict(gold[0][name])
    arg = next(iter(args))
    wrong_value = [{name: {**args, arg: "definitely wrong value"}}]
    ok, err = check(case, wrong_value)
    assert not ok and err
    assert not check(case, [{"no_such_function": args}])[0]
    assert not check(case, gold + gold)[0]  # simple: exactly one call
    assert not check(case, [])[0]
    assert not check(case, [{name: {}}])[0]  # missing required parameters
    ok, err = check(case, None, decode_error="unparseable")
    assert not ok and "Failed to decode" in err
    assert not check(case, ["not a dict"])[0]


def test_checker_parallel_order_free_and_count():
    case = load_cases("parallel", limit=1)[0]
    gold = gold_output(case)
    assert len(gold) > 1
    assert check(case, gold[::-1])[0]
    assert not check(case, gold[:-1])[0]


@pytest.mark.parametrize("category", ["irrelevance", "live_irrelevance"])
def test_irrelevance_rule(category):
    case = load_cases(category, limit=1)[0]
    fn = case.functions[0]
    assert check(case, [])[0]
    assert check(case, None, decode_error="model wrote prose")[0]
    assert check(case, [{}])[0]  # BFCL's is_empty_output
    ok, err = check(case, [{fn["name"]: {}}])
    assert not ok and "should not" in err


def test_relevance_rule():
    case = load_cases("live_relevance", limit=1)[0]
    assert not check(case, [])[0]
    assert check(case, [{case.functions[0]["name"]: {}}])[0]


# ---------------------------------------------------------------------------------------------
# BFCL's prompting style, built by bfcl_eval


def test_bfcl_system_prompt():
    case = load_cases("simple_python", limit=1)[0]
    prompt = bfcl_system_prompt(case.functions)
    assert prompt.startswith("You are an expert in composing functions.")
    assert "[func_name1(params_name1=params_value1" in prompt
    assert case.functions[0]["name"] in prompt
    assert "Note that the provided function is in Python 3 syntax." in prompt
    assert "Python 3 syntax" not in case.functions[0]["description"]  # input not mutated
    from_tools = bfcl_system_prompt(parse_tools(case.functions))
    assert case.functions[0]["name"] in from_tools
    msgs = bfcl_prompt_messages([{"role": "system", "content": "Be brief."}, *case.messages], case.functions)
    assert msgs[0]["role"] == "system" and msgs[0]["content"] == prompt + "\n\nBe brief."
    msgs = bfcl_prompt_messages(case.messages, case.functions)
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[0]["content"] == prompt


# ---------------------------------------------------------------------------------------------
# run_eval: resume and reports


class GoldMethod:
    """Test double of a Method: answers each question with its gold calls (or no call)."""

    name = "gold-double"
    config = {"kind": "test"}

    def __init__(self, cases, fail_ids=()):
        self.by_question = {}
        for c in cases:
            out = gold_output(c) if c.possible_answer is not None else []
            calls = [Call(n, a) for d in out for n, a in d.items()]
            self.by_question[json.dumps(c.messages)] = (c.id, calls)
        self.fail_ids = set(fail_ids)
        self.seen = []

    def answer(self, messages, tools):
        assert tools and all(hasattr(t, "name") for t in tools)
        cid, calls = self.by_question[json.dumps(list(messages))]
        self.seen.append(cid)
        if cid in self.fail_ids:
            return Answer(calls=[], raw_text="???", error="could not parse", timings={"decode": 0.01})
        return Answer(calls=calls, raw_text=str(calls), input_tokens=100, output_tokens=10,
                      timings={"prefill": 0.01, "decode": 0.02})


def test_run_eval_resume_and_reports(tmp_path):
    cats = ["simple_python", "irrelevance", "live_multiple"]
    cases = [c for cat in cats for c in load_cases(cat, limit=3)]
    irr_fail = load_cases("irrelevance", limit=1)[0].id
    ast_fail = load_cases("live_multiple", limit=1)[0].id
    method = GoldMethod(cases, fail_ids={irr_fail, ast_fail})
    out = tmp_path / "run"
    summary = run_eval(method, cats, limit=3, out_dir=out, progress=False)
    assert len(method.seen) == 9
    recs = [json.loads(line) for line in (out / "cases.jsonl").read_text().splitlines()]
    assert [r["id"] for r in recs] == [c.id for c in cases]
    by_id = {r["id"]: r for r in recs}
    assert by_id[irr_fail]["correct"] is True  # unparseable output = no call (BFCL's rule)
    assert by_id[ast_fail]["correct"] is False and "decode" in by_id[ast_fail]["error"]
    assert sum(r["correct"] for r in recs) == 8
    for r in recs:
        assert {"id", "category", "correct", "error", "calls", "raw_text", "timings", "latency",
                "input_tokens", "output_tokens"} <= set(r)
    assert summary["overall"]["n"] == 9 and summary["overall"]["correct"] == 8
    assert summary["categories"]["simple_python"]["accuracy"] == 1.0
    assert abs(summary["categories"]["live_multiple"]["accuracy"] - 2 / 3) < 1e-9

    for name in ("results.json", "results.md", "accuracy_latency.png"):
        assert (out / name).stat().st_size > 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["meta"]["method"] == "gold-double"
    assert saved["meta"]["bfcl_eval_version"] not in ("", "not installed")
    assert isinstance(saved["meta"]["command"], list) and saved["meta"]["method_config"] == {"kind": "test"}
    assert "| simple_python |" in (out / "results.md").read_text()

    # resume: nothing is redone
    method.seen.clear()
    run_eval(method, cats, limit=3, out_dir=out, progress=False)
    assert method.seen == []
    # an interrupted write (cut last line) and a new category: only those cases are run
    lines = (out / "cases.jsonl").read_text().splitlines(keepends=True)
    (out / "cases.jsonl").write_text("".join(lines[:-1]) + lines[-1][:20])
    more = load_cases("live_parallel", limit=3)
    method2 = GoldMethod(cases + more)
    summary = run_eval(method2, cats + ["live_parallel"], limit=3, out_dir=out, progress=False)
    assert method2.seen == [cases[-1].id] + [c.id for c in more]
    assert summary["overall"]["n"] == 12
    # resume=False starts over
    method3 = GoldMethod(cases)
    run_eval(method3, ["simple_python"], limit=2, out_dir=out, resume=False, progress=False)
    assert len(method3.seen) == 2 and len((out / "cases.jsonl").read_text().splitlines()) == 2


def test_compare_runs(tmp_path):
    cats = ["simple_python", "irrelevance"]
    cases = [c for cat in cats for c in load_cases(cat, limit=2)]
    run_eval(GoldMethod(cases), cats, limit=2, out_dir=tmp_path / "a", progress=False)
    run_eval(GoldMethod(cases, fail_ids={cases[0].id}), cats, limit=2, out_dir=tmp_path / "b", progress=False)
    paths = report.compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp")
    md = paths["md"].read_text()
    assert "gold-double" in md and "gold-double (b)" in md and "| simple_python |" in md
    assert "100.0" in md and "50.0" in md
    assert paths["png"].stat().st_size > 0


class SlowGoldMethod(GoldMethod):
    """Gold answers with a fixed prefill/decode split and a retrieval ranking (like the cascade's)."""

    def __init__(self, cases, name, prefill, decode, fail_ids=()):
        super().__init__(cases, fail_ids)
        self.name, self.prefill, self.decode = name, prefill, decode

    def answer(self, messages, tools):
        answer = super().answer(messages, tools)
        answer.timings = {"prefill": self.prefill, "decode": self.decode}
        # gold first in the ranking; nothing retrieved = refusal
        gold = [c.name for c in answer.calls]
        answer.details = {"ranking": list(dict.fromkeys(gold + [t.name for t in tools])), "retrieved": sorted(set(gold))}
        answer.injected_tokens, answer.output_tokens = 30, 10
        return answer


def test_side_by_side_interleaves_and_compares(tmp_path):
    cats = ["multiple", "irrelevance"]
    cases = [c for cat in cats for c in load_cases(cat, limit=2)]
    fast = SlowGoldMethod(cases, "fast", prefill=0.0, decode=0.0)
    slow = SlowGoldMethod(cases, "slow", prefill=0.0, decode=0.0, fail_ids={cases[0].id})
    order = []
    for m in (fast, slow):
        original = m.answer
        m.answer = lambda messages, tools, m=m, original=original: (order.append(m.name), original(messages, tools))[1]
    dirs = {"fast": tmp_path / "fast", "slow": tmp_path / "slow"}
    summaries = run_side_by_side({"fast": fast, "slow": slow}, cats, limit=2, out_dirs=dirs, progress=False)
    assert order == ["fast", "slow"] * 4  # case by case, every method in turn
    assert summaries["fast"]["overall"]["accuracy"] == 1.0 and summaries["slow"]["overall"]["correct"] == 3
    records = [json.loads(line) for line in (tmp_path / "fast" / "cases.jsonl").read_text().splitlines()]
    assert records[0]["gold_functions"] and records[-1]["gold_functions"] == []

    # resume: only a method missing a case runs it
    lines = (tmp_path / "slow" / "cases.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "slow" / "cases.jsonl").write_text("".join(lines[:-1]))
    order.clear()
    run_side_by_side({"fast": fast, "slow": slow}, cats, limit=2, out_dirs=dirs, progress=False)
    assert order == ["slow"]

    paths = report.compare_runs([dirs["fast"], dirs["slow"]], tmp_path / "cmp", names=["fast", "slow"], baseline="slow")
    analysis = json.loads(paths["json"].read_text())["analysis"]
    assert analysis["slow"]["generated_tokens"]["share"] == 0.25
    retrieval = analysis["fast"]["retrieval"]
    assert retrieval["multiple"]["recall@1"] == 1.0 and retrieval["multiple"]["exact_set_accuracy"] == 1.0
    assert retrieval["irrelevance"]["refusal_accuracy"] == 1.0
    assert retrieval["irrelevance"]["refused"] == 1.0 and retrieval["multiple"]["refused"] == 0.0
    # a single run's own report carries its cascade figures too
    single = (tmp_path / "fast" / "results.md").read_text()
    assert summaries["fast"]["retrieval"]["multiple"]["recall@1"] == 1.0 and "## Retrieval on BFCL" in single
    with pytest.raises(ValueError, match="baseline"):
        report.compare_runs([dirs["fast"]], tmp_path / "cmp2", names=["fast"], baseline="nope")


def test_latency_analysis_pairs_cases():
    base = [{"id": str(i), "latency": 10.0, "timings": {"prefill": 6.0, "decode": 4.0}} for i in range(4)]
    cascade = [{"id": str(i), "latency": 6.5, "output_tokens": 3, "injected_tokens": 7} for i in range(4)]
    cascade.append({"id": "not-in-baseline", "latency": 100.0})
    a = report.side_by_side_analysis({"direct": base, "cascade": cascade}, baseline="direct")["cascade"]
    assert a["latency_vs_baseline"]["n"] == 4 and abs(a["latency_vs_baseline"]["ratio_of_medians"] - 0.65) < 1e-9
    assert a["vs_prefill_decode"]["P"] == 6.0 and abs(a["vs_prefill_decode"]["P+0.15D"] - 6.6) < 1e-9
    assert a["vs_prefill_decode"]["met"] is False  # the mean includes the 100 s case
    assert a["generated_tokens"] == {"generated": 12, "injected": 28, "share": 0.3}
