"""`hyfunc bench small-retrieval` on a tiny cascade and real MiniLM, a few held-out fc-train requests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyfunc.cli import main
from hyfunc.eval.small_retrieval import held_out_requests
from hyfunc.models.minilm import MINILM_NAME
from hyfunc.cascade.selector import identity_selector
from tests.odia_fixtures import tiny_artifact
from tests.test_small_path import fc_subset


def test_bench_small_retrieval(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = fc_subset(tmp_path / "data", 300)
    requests = held_out_requests([str(data)], limit=10)
    assert sum(bool(ex.answers) for ex in requests) <= 10 and any(not ex.answers for ex in requests)
    selector = identity_selector()
    selector.config.lexical_weight = 1.0
    selector.save(tmp_path / "selector", meta={"embedder": MINILM_NAME})
    out = tmp_path / "report"
    assert main(["bench", "small-retrieval", "--data", str(data), "--selector", str(tmp_path / "selector"),
                 "--artifact", str(tiny_artifact(tmp_path / "cascade")), "--limit", "10", "--out", str(out)]) == 0
    result = json.loads((out / "small_retrieval.json").read_text())
    assert result["requests"] == len(requests) and result["without_call"] >= 1
    names = list(result["selectors"])
    assert names[0].startswith("cascade retriever") and len(names) == 3
    fused, cosine = result["selectors"][names[1]], result["selectors"][names[2]]
    for m in result["selectors"].values():
        assert 0.0 <= m["recall@1"] <= m["recall@3"] <= m["recall@5"] <= 1.0 and m["ms_median"] > 0
    # Real MiniLM on real requests: far above chance (fc-train lists offer several tools).
    assert cosine["recall@1"] >= 0.5 and fused["recall@3"] >= 0.8, result
    assert "| small-path selector (MiniLM + BM25) |" in capsys.readouterr().out
