"""The command line's happy paths, end to end through `main([...])`, on tiny models saved to disk
(as a user's own model directory would be) and a cascade prepared from them."""
import json
from pathlib import Path

import pytest
import torch

from hyfunc.cascade.prepare import PrepareConfig, prepare
from hyfunc.cli import main
from hyfunc.cli.checks import format_answer
from hyfunc.data import OOD_DATA
from hyfunc.formats.calls import Call, parse_python_calls
from hyfunc.formats.tools_file import read_tools_file
from hyfunc.formats.validate import argument_errors
from hyfunc.methods.base import Answer
from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod
from hyfunc.models.backend import Backend
from tests.test_cascade_prepare import FX, TABLE, WEATHER, _examples
from tests.tiny_models import tiny_backend

TOOLS = str(Path(__file__).resolve().parents[1] / "examples" / "tools.json")


def _save(backend: Backend, directory: Path) -> str:
    backend.model.save_pretrained(directory)
    backend.tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def silent_model(tmp_path_factory) -> str:
    """A tiny model whose every logit is 0: greedy decoding picks token 0, which its generation
    config names an end of sequence, so it always answers with nothing ("no tool fits")."""
    backend = tiny_backend(seed=3)
    with torch.no_grad():
        backend.model.get_output_embeddings().weight.zero_()
    backend.model.generation_config.eos_token_id = [0, backend.tokenizer.eos_token_id]
    return _save(backend, tmp_path_factory.mktemp("silent"))


@pytest.fixture(scope="module")
def cascade_dir(tmp_path_factory) -> Path:
    """A cascade prepared on toy data from saved tiny models, with a library retriever."""
    root = tmp_path_factory.mktemp("cascade")
    large = _save(tiny_backend(hidden_size=48, seed=1), root / "large")
    small = _save(tiny_backend(hidden_size=32, seed=2), root / "small")
    data = root / "toy.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _examples()) + "\n")
    library = root / "library.jsonl"
    library.write_text("\n".join(json.dumps(t) for t in [WEATHER, TABLE, FX]) + "\n")
    config = PrepareConfig(
        large_model=large, small_model=small, data=[str(data)], val_fraction=0.3, lora_rank=0, sft_epochs=1,
        retriever={"proj_dim": 16, "epochs": 1, "refusal_head": True}, library=str(library),
    )
    with pytest.MonkeyPatch.context() as patch:  # prepare caches the library's embeddings there
        patch.setenv("HYFUNC_HOME", str(root / "home"))
        prepare(config, root / "artifact", large=Backend(large, device="cpu"), small=Backend(small, device="cpu"))
    return root / "artifact"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HYFUNC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_call_direct_in_every_format(silent_model, capsys):
    base = ["call", "--method", "direct", "--model", silent_model, "--tools", TOOLS, "--query", "Tell me a joke."]
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out) == {"calls": [], "error": None}
    assert main(base + ["--format", "openai"]) == 0
    assert json.loads(capsys.readouterr().out) == {"role": "assistant", "content": ""}
    assert main(base + ["--format", "python", "--timings"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "[]" and "tokens in" in captured.err


def test_answer_formats_with_calls():
    answer = Answer(calls=[Call("get_weather", {"city": "Oslo", "unit": "celsius"}), Call("f", {})])
    assert format_answer(answer, "python") == "[get_weather(city='Oslo', unit='celsius'), f()]"
    assert json.loads(format_answer(answer, "json")) == {
        "calls": [{"get_weather": {"city": "Oslo", "unit": "celsius"}}, {"f": {}}], "error": None}
    message = json.loads(format_answer(answer, "openai"))
    assert message["role"] == "assistant" and message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "f"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo", "unit": "celsius"}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in message["tool_calls"])


def test_demo_direct(silent_model, capsys):
    assert main(["demo", "--method", "direct", "--model", silent_model]) == 0
    out = capsys.readouterr().out
    demo = json.loads((DEFAULT_ARTIFACT.parent / "demo.json").read_text())
    assert out.count("no tool fits") == len(demo["requests"]) and "get_weather" in out


def test_eval_bfcl_direct_records_provenance(silent_model, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["eval", "bfcl", "--method", "direct", "--model", silent_model, "--categories", "simple", "live_relevance",
            "irrelevance", "--limit", "1", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["categories"]["irrelevance"]["correct"] == 1  # no call: right on irrelevance
    assert results["categories"]["simple_python"]["correct"] == 0
    meta = results["meta"]
    assert meta["method_config"]["model"] == silent_model and meta["method_config"]["validate"] is True
    prov = meta["provenance"]
    assert len(prov["git"]["commit"]) == 40 and isinstance(prov["git"]["dirty"], bool)
    assert prov["models"][silent_model]["dtype"] in ("float32", "bfloat16")
    assert prov["cpu"]["cores"] >= 1 and prov["torch_threads"] >= 1
    assert "Provenance: commit " in (out / "results.md").read_text()


def test_eval_ood_scores_both_methods_per_kind_and_names_what_the_cascade_trained_on(cascade_dir, silent_model, tmp_path, capsys):
    out = tmp_path / "ood"
    toy = json.loads((cascade_dir / "manifest.json").read_text())["data"]["paths"][0]  # the cascade's own data
    argv = ["eval", "ood", "--artifact", str(cascade_dir), "--with-direct", silent_model, "--data", toy, str(OOD_DATA),
            "--sources", "toy", "agentdojo", "--per-source", "3", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "kinds.json").read_text())
    main_label, direct_label = summary["methods"]
    assert summary["baseline"] == direct_label and direct_label.startswith("direct:")
    overall = summary["kinds"]["overall"]
    assert overall[main_label]["n"] == overall[direct_label]["n"] == 6
    # the silent model never calls: right exactly on the no-call cases
    assert overall[direct_label]["correct"] == summary["kinds"]["irrelevance"][direct_label]["n"]
    assert summary["set"]["trained_on"][main_label] == ["toy"] and summary["set"]["trained_on"][direct_label] == []
    assert f"note: {main_label} was trained on toy" in printed
    assert (out / "kinds.png").stat().st_size > 0 and (out / "comparison.md").is_file()
    assert sorted(p.name for p in (out / "data").glob("OOD_*.json"))


def test_call_cascade_reads_a_large_library_per_function(cascade_dir, home, capsys, monkeypatch):
    tools = read_tools_file(TOOLS)
    base = ["call", "--artifact", str(cascade_dir), "--tools", TOOLS, "--query", "Weather in Oslo?", "--format", "python"]
    embeddings = home / "library-embeddings"
    # Up to MAX_PROMPT_TOOLS the library is read in one prompt: no per-function embeddings.
    assert main(base) == 0
    assert not embeddings.exists() or not list(embeddings.iterdir())
    capsys.readouterr()
    monkeypatch.setattr(HyFuncMethod, "MAX_PROMPT_TOOLS", len(tools) - 1)
    assert main(base) == 0
    captured = capsys.readouterr()
    assert len(list(embeddings.iterdir())) == 1  # the six tools, embedded one by one and cached
    # Whatever the toy cascade chose, it printed python calls that fit the tools.
    for call in parse_python_calls(captured.out.strip()):
        assert argument_errors(call, tools) == []


def test_eval_bfcl_cascade_records_its_config_and_artifact(cascade_dir, tmp_path):
    out = tmp_path / "run"
    argv = ["eval", "bfcl", "--artifact", str(cascade_dir), "--categories", "multiple", "--limit", "1", "--out", str(out)]
    assert main(argv) == 0
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["method_config"]["artifact"] == str(cascade_dir)
    assert meta["method_config"]["options"] == {"soft_token": True, "retriever": True, "templating": True,
                                                "off_topic_gate": True, "large_values": True, "large_choices": True,
                                                "large_numbers": True, "described_forms": True, "value_drafts": True, "alternatives": True,
                                                "small_model": True, "follow_up_alone": True,
                                                "gate_confirms_alone": True}
    assert set(meta["provenance"]["models"]) == {meta["method_config"]["large_model"], meta["method_config"]["small_model"]}
    (record,) = meta["provenance"]["artifacts"].values()
    assert len(record["manifest_sha256"]) == 64


def test_eval_bfcl_switches_the_large_models_values_off(cascade_dir, tmp_path):
    out = tmp_path / "run"
    argv = ["eval", "bfcl", "--artifact", str(cascade_dir), "--ablate", "large_values", "large_choices", "large_numbers",
            "--categories", "multiple", "--limit", "1", "--out", str(out)]
    assert main(argv) == 0
    options = json.loads((out / "results.json").read_text())["meta"]["method_config"]["options"]
    assert not (options["large_values"] or options["large_choices"] or options["large_numbers"])
    assert options["templating"] and options["retriever"]


def test_cli_ablations_are_the_cascades_switches():
    from dataclasses import fields

    from hyfunc.methods import ABLATABLE
    from hyfunc.methods.cascade import CascadeOptions

    assert ABLATABLE == [f.name for f in fields(CascadeOptions)]
