"""`hyfunc bench serve` and `bench isolation` against a real (tiny-model) server: the reports count what happened."""
from __future__ import annotations

import json
from pathlib import Path

from hyfunc.cli import main
from tests.serve_process import running_server
from tests.test_serve_sdk import TOOLS


def test_bench_serve_reports_each_level(tmp_path: Path) -> None:
    rows = [{"query": f"Weather in city {i}?", "tools": [t["function"] for t in TOOLS], "answers": []} for i in range(4)]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    with running_server({"method": "cascade"}) as url:
        assert main(["bench", "serve", "--url", url, "--data", str(data), "--requests", "4", "--concurrency", "1", "2",
                     "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "serve.json").read_text())
    assert report["tools"] == 3 and [s["concurrency"] for s in report["summaries"]] == [1, 2]
    for summary in report["summaries"]:
        assert summary["ok"] == 4 and summary["errors"] == 0 and summary["ttft_p50_s"] > 0
        # the tiny cascade always calls: its arguments stream before the answer is complete
        assert 0 < summary["first_argument_over_p50"] < 1
    assert "| server |" in (tmp_path / "out" / "serve.md").read_text()


def test_bench_isolation_sends_a_new_library_while_small_requests_run(tmp_path: Path) -> None:
    with running_server({"method": "cascade", "library": True, "max_new_tool_tokens": 0, "HYFUNC_HOME": str(tmp_path / "home")}) as url:
        assert main(["bench", "isolation", "--url", url, "--requests", "2", "--tools", "140", "--library-seed", "1",
                     "--poll", "0.1", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "isolation.json").read_text())["summary"]
    assert summary["library"]["status"] == 200 and summary["library"]["refused_429"] >= 1  # embedded off the request path
    assert summary["library"]["first_retry_after"] >= 1 and summary["meanwhile_not_200"] == 0
    assert summary["alone_median_s"] > 0 and summary["library_tools"] == 140
