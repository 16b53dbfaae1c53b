"""End to end on the real SmolLM2-135M: direct prompting on two BFCL cases, official checker."""
import json

import pytest

from hyfunc.eval.bfcl import check, load_cases, run_eval
from hyfunc.methods import load_method

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def method():
    return load_method("direct", model="smollm2-135m", style="bfcl")


def test_two_bfcl_cases_scored_by_the_official_checker(method, tmp_path):
    results = run_eval(method, ["simple_python", "irrelevance"], limit=1, out_dir=tmp_path, progress=False)
    records = [json.loads(line) for line in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["simple_python_0", "irrelevance_0"]
    for record in records:
        assert record["output_tokens"] > 0 and record["input_tokens"] > 100
        assert record["timings"]["prefill"] > 0
        # the stored verdict is the official checker's verdict on the stored output
        case = load_cases(record["category"], limit=1)[0]
        assert check(case, record["calls"], decode_error=record["model_error"])[0] == record["correct"]
    assert results and (tmp_path / "results.json").is_file() and (tmp_path / "accuracy_latency.png").is_file()


def test_native_style_is_refused_without_a_tool_template(method):
    from hyfunc.methods.direct import DirectMethod

    with pytest.raises(ValueError, match="no tool-calling chat template"):
        DirectMethod(method.backend, style="native")
