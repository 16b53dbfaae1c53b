"""The refusal head refitted on requests padded with library tools (cascade/refusal_head.py), on
tiny random models and toy data; the padding and the threshold choice on their own."""
import json

import numpy as np
import pytest
import torch

from hyfunc.cascade.data import Example, load_examples, pad_with_tools
from hyfunc.cascade.prepare import PrepareConfig, prepare
from hyfunc.cascade.refusal_head import refit_refusal_head
from hyfunc.cascade.retriever import Retriever, calibrate_refusal, threshold_for_answered_share
from hyfunc.cli import main
from hyfunc.formats.calls import Call
from hyfunc.formats.schema import parse_tools
from tests.test_cascade_prepare import FX, TABLE, WEATHER, _examples
from tests.tiny_models import tiny_backend


def _library(n: int) -> list[dict]:
    return [{"name": f"lib_tool_{i}", "description": f"Library tool number {i}",
             "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}
            for i in range(n)]


def test_padding_adds_library_tools_around_the_own_ones_and_keeps_the_answer():
    own = parse_tools([WEATHER, TABLE])
    pool = parse_tools(_library(30) + [WEATHER])  # a pool tool named like an own one is never added twice
    examples = [Example(f"e{i}", "toy", f"weather {i}", own, [Call("get_weather", {"city": str(i)})]) for i in range(10)]
    examples.append(Example("no-tools", "toy", "hello", [], []))
    padded = pad_with_tools(examples, pool, fraction=0.5, max_extra=6, seed=0)
    assert len(padded) == 5  # half of the ten with tools
    for ex in padded:
        base = next(e for e in examples if ex.id.startswith(e.id + "~padded~"))
        names = [t.name for t in ex.tools]
        assert len(names) == len(set(names)) and {"get_weather", "book table"} <= set(names)
        assert 2 <= len(names) - 2 <= 6
        assert ex.answers == base.answers and ex.query == base.query and ex.source == "toy~padded"
    assert [ex.id for ex in pad_with_tools(examples, pool, 0.5, 6, seed=0)] == [ex.id for ex in padded]
    assert [ex.id for ex in pad_with_tools(examples, pool, 0.5, 6, seed=1)] != [ex.id for ex in padded]


def test_refusal_threshold_maximises_balanced_accuracy():
    answerable = np.array([-3.0, -2.0, -1.5, 0.5, 1.0, 2.0, 9.0])
    calls = np.array([False, False, False, True, True, True, False])
    no_calls = np.array([True, True, True, False, False, False, False])  # the last is in neither: not counted
    threshold, balanced = calibrate_refusal(answerable, calls, no_calls)
    assert -1.5 < threshold < 0.5 and balanced == 1.0
    # overlapping classes: one call example below every refusal is the price of refusing all three
    threshold, balanced = calibrate_refusal(np.array([0.0, 1.0, 2.0, 0.5]), np.array([1, 1, 1, 0], bool),
                                            np.array([0, 0, 0, 1], bool))
    assert balanced == pytest.approx(5 / 6) and 0.5 < threshold < 1.0


def test_threshold_for_an_answered_share_of_the_call_requests():
    calls = np.array([3.0, -1.0, 0.0, 1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    assert threshold_for_answered_share(calls, 1.0) < -1.0  # every call request answered
    t = threshold_for_answered_share(calls, 0.9)  # one of ten may be refused: the lowest
    assert -1.0 < t < 0.0 and (calls >= t).mean() == 0.9
    t = threshold_for_answered_share(calls, 0.75)  # two of ten (floor of 2.5)
    assert 0.0 < t < 1.0 and (calls >= t).mean() == 0.8
    assert threshold_for_answered_share(calls, 0.0) > 8.0


def test_refit_changes_only_the_refusal_head_and_records_the_choice(tmp_path):
    data = tmp_path / "toy.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _examples()) + "\n")
    library = tmp_path / "library.jsonl"
    library.write_text("\n".join(json.dumps(t) for t in _library(12)) + "\n")
    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    config = PrepareConfig(
        large_model="tiny-large", small_model="tiny-small", data=[str(data)], val_fraction=0.3, shard_size=4,
        retriever={"proj_dim": 16, "epochs": 2, "lr": 1e-2, "refusal_head": True}, sft_epochs=1, lora_rank=0,
        sft_grad_accum=2, off_topic_gate=False,
    )
    artifact = tmp_path / "artifact"
    prepare(config, artifact, large=large, small=small)
    old = Retriever.load(artifact / "retriever")

    metrics = refit_refusal_head(artifact, [str(data)], str(library), padding=1.0, max_extra=4,
                                 l2_grid=(1e-3, 1.0), tolerance=1.0, val_fraction=0.3, refusal_fraction=0.5,
                                 large=large)
    new = Retriever.load(artifact / "retriever")
    # a tolerance of 1.0 admits every weight: the largest is chosen
    assert metrics["l2"] == 1.0 and set(metrics["l2_grid"]) == {"0.001", "1.0"}
    assert new.config.refusal_threshold == metrics["after"]["refusal_threshold"]
    # the threshold answers at least 99 % of the validation call requests, own tools and padded
    after = metrics["after"]["validation"]
    calls = [after[k] for k in after if k.endswith(", call")]
    assert sum(g["n"] * g["refused"] for g in calls) <= 0.01 * sum(g["n"] for g in calls) + 1e-9
    assert not torch.equal(new.refusal.weight, old.refusal.weight)
    for name, tensor in old.state_dict().items():
        if not name.startswith("refusal."):
            assert torch.equal(new.state_dict()[name], tensor), name
    assert new.config.threshold == old.config.threshold  # the keep threshold is not the head's
    assert metrics["before"]["refusal_threshold"] == old.config.refusal_threshold
    kinds = set(metrics["after"]["validation"])
    assert {"own tools, call", "padded, call"} <= kinds
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["metrics"]["retriever"]["refusal_refit"]["l2"] == 1.0
    assert new.meta["metrics"]["refusal_refit"]["data"]["library"] == str(library)
    padded = [ex for ex in load_examples([str(data)])]  # the toy data itself is untouched
    assert all("~padded~" not in ex.id for ex in padded)


def test_refusal_only_needs_a_prepared_cascade_and_a_library(tmp_path, capsys):
    assert main(["prepare", "--refusal-only", "--out", str(tmp_path), "--data", str(tmp_path)]) == 2
    assert "not a prepared cascade" in capsys.readouterr().err
    (tmp_path / "manifest.json").write_text("{}")
    assert main(["prepare", "--refusal-only", "--out", str(tmp_path), "--data", str(tmp_path)]) == 2
    assert "needs --library" in capsys.readouterr().err
