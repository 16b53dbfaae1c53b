"""`hyfunc bench serve` against a real (tiny-model) server: the report counts what happened."""
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
