"""`hyfunc bench serve` and `bench isolation` against a real (tiny-model) server: the reports count what happened."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from hyfunc.cli import main
from tests.serve_process import running_server
from tests.test_serve_sdk import TOOLS


def test_bench_serve_reports_each_level(tmp_path: Path) -> None:
    queries = [f"Weather in city {i}?" for i in range(4)]
    functions = [t["function"] for t in TOOLS]
    data = tmp_path / "data.jsonl"
    with running_server({"method": "cascade"}) as url:
        # The answers: what this (greedy) server calls for the first two requests, nothing for the other two.
        answers = [[{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                    for c in httpx.post(f"{url}/v1/chat/completions", json={"model": "hyfunc", "tools": TOOLS, "messages": [
                        {"role": "user", "content": q}]}, timeout=60).json()["choices"][0]["message"]["tool_calls"]]
                   for q in queries[:2]] + [[], []]
        data.write_text("\n".join(json.dumps({"query": q, "tools": functions, "answers": a}) for q, a in zip(queries, answers)))
        assert main(["bench", "serve", "--url", url, "--data", str(data), "--requests", "4", "--concurrency", "1", "2",
                     "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "serve.json").read_text())
    assert report["tools"] == 3 and [s["concurrency"] for s in report["summaries"]] == [1, 2]
    for summary in report["summaries"]:
        assert summary["ok"] == 4 and summary["errors"] == 0 and summary["ttft_p50_s"] > 0
        assert summary["exact_calls"] == 2 and summary["calls_as_text"] == 0 and summary["requests_per_min"] > 0
        # the tiny cascade always calls: its arguments stream before the answer is complete
        assert 0 < summary["first_argument_over_p50"] < 1
    assert "| server |" in (tmp_path / "out" / "serve.md").read_text()


def test_bench_serve_needs_a_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "serve", "--out", str(tmp_path)]) == 2
    assert "--url" in capsys.readouterr().err


def test_bench_serve_names_a_missing_llama_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "serve", "--llama-server", str(tmp_path / "no-such-binary"), "--out", str(tmp_path)]) == 2
    assert "make llama-server" in capsys.readouterr().err


def test_bench_isolation_sends_a_new_library_while_small_requests_run(tmp_path: Path) -> None:
    with running_server({"method": "cascade", "library": True, "max_new_tool_tokens": 0, "HYFUNC_HOME": str(tmp_path / "home")}) as url:
        assert main(["bench", "isolation", "--url", url, "--requests", "2", "--tools", "140", "--library-seed", "1",
                     "--poll", "0.1", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "isolation.json").read_text())["summary"]
    assert summary["library"]["status"] == 200 and summary["library"]["refused_429"] >= 1  # embedded off the request path
    assert summary["library"]["first_retry_after"] >= 1 and summary["meanwhile_not_200"] == 0
    assert summary["alone_median_s"] > 0 and summary["library_tools"] == 140


@pytest.mark.integration
def test_bench_serve_measures_llama_server(tmp_path: Path) -> None:
    """llama.cpp's own server (`make llama-server`) started, measured through the SDK and stopped."""
    data = tmp_path / "data.jsonl"
    functions = [t["function"] for t in TOOLS]
    data.write_text("\n".join(json.dumps({"query": f"Weather in city {i}?", "tools": functions, "answers": []}) for i in range(2)))
    assert main(["bench", "serve", "--llama-server", "llama-server", "--llama-server-model", "smollm2-135m",
                 "--llama-server-slots", "2", "--llama-server-context", "2048", "--requests", "2", "--concurrency", "2",
                 "--warmup", "1", "--max-tokens", "16", "--data", str(data), "--out", str(tmp_path / "out")]) == 0
    [summary] = json.loads((tmp_path / "out" / "serve.json").read_text())["summaries"]
    assert summary["server"] == "llama-server smollm2-135m -np 2" and summary["ok"] == 2 and summary["errors"] == 0
    assert "smollm2-135m.gguf" in (tmp_path / "out" / "llama-server-np2.log").read_text()  # the GGUF it was given
