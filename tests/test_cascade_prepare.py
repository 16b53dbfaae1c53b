"""The whole offline preparation and the online cascade, on tiny random models and toy data."""
import json

import pytest

from hyfunc.cascade.pipeline import CascadeOptions, HyFuncMethod
from hyfunc.cascade.prepare import PrepareConfig, prepare
from hyfunc.cascade.retriever import Retriever
from hyfunc.cascade.small_model import load_projector
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.validate import argument_errors
from tests.tiny_models import tiny_backend

WEATHER = {"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object",
           "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}
TABLE = {"name": "book table", "description": "Book a restaurant table", "parameters": {"type": "object",
         "properties": {"people": {"type": "integer"}, "time": {"type": "string"}}, "required": ["people"]}}
FX = {"name": "fx.convert", "description": "Convert money", "parameters": {"type": "object",
      "properties": {"amount": {"type": "number"}, "to": {"type": "string"}}, "required": ["amount", "to"]}}


def _examples():
    rows = []
    for i in range(10):
        rows.append({"id": f"w{i}", "query": f"What is the weather in city {i}?", "tools": [WEATHER, TABLE, FX],
                     "answers": [{"name": "get_weather", "arguments": {"city": f"city {i}"}}]})
        rows.append({"id": f"t{i}", "query": f"Book a table for {i + 2} people", "tools": [TABLE, FX],
                     "answers": [{"name": "book table", "arguments": {"people": i + 2}}]})
    rows.append({"id": "n0", "query": "Tell me a joke", "tools": [FX], "answers": []})
    return rows


@pytest.fixture()
def data_file(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _examples()) + "\n")
    return path


def test_prepare_writes_every_artifact_resumes_and_serves(data_file, tmp_path):
    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    config = PrepareConfig(
        large_model="tiny-large", small_model="tiny-small", data=[str(data_file)], val_fraction=0.3,
        shard_size=4, retriever={"proj_dim": 16, "epochs": 3, "lr": 1e-2}, sft_epochs=1, lora_rank=4, sft_grad_accum=2,
    )
    out = tmp_path / "artifact"
    manifest = prepare(config, out, large=large, small=small)

    for path in ("manifest.json", "retriever/manifest.json", "projector.safetensors", "adapter", "sft/state.json"):
        assert (out / path).exists(), path
    assert manifest["data"]["train"] + manifest["data"]["validation"] >= 21
    assert manifest["metrics"]["sft"]["items"] > 0 and len(manifest["metrics"]["sft"]["epoch_losses"]) == 1
    assert set(manifest["metrics"]["retriever"]["validation"]) >= {"recall@1", "exact_set_accuracy"}

    # resuming recomputes nothing: shards and the retriever are reused as they are
    shards = sorted((out / "embeddings").glob("*.safetensors"))
    stamps = [p.stat().st_mtime_ns for p in shards]
    retriever_stamp = (out / "retriever" / "retriever.safetensors").stat().st_mtime_ns
    prepare(config, out, large=large, small=tiny_backend(hidden_size=32, seed=2))
    assert [p.stat().st_mtime_ns for p in shards] == stamps
    assert (out / "retriever" / "retriever.safetensors").stat().st_mtime_ns == retriever_stamp

    # the online cascade answers with schema-valid calls to offered tools only
    method = HyFuncMethod(large, tiny_backend(hidden_size=32, seed=2), Retriever.load(out / "retriever"), load_projector(out))
    tools = parse_tools([WEATHER, TABLE, FX])
    answer = method.answer([{"role": "user", "content": "What is the weather in Oslo?"}], tools)
    for call in answer.calls:
        assert argument_errors(call, tools) == []
    assert {"large_prefill", "retrieve"} <= set(answer.timings)
    if answer.calls:
        assert answer.output_tokens + answer.injected_tokens > 0 and "small_decode" in answer.timings


def test_cascade_refuses_without_running_the_small_model(data_file, tmp_path):
    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    config = PrepareConfig(large_model="l", small_model="s", data=[str(data_file)], val_fraction=0.3,
                           retriever={"proj_dim": 16, "epochs": 1}, sft_epochs=1, lora_rank=0)
    prepare(config, tmp_path, large=large, small=small)
    retriever = Retriever.load(tmp_path / "retriever")
    retriever.config.refusal_threshold = 2.0  # above any cosine: always refuse
    method = HyFuncMethod(large, small, retriever, load_projector(tmp_path))
    answer = method.answer([{"role": "user", "content": "Tell me a joke"}], parse_tools([FX]))
    assert answer.calls == [] and "small_decode" not in answer.timings and "small_prefill" not in answer.timings


def test_ablation_switches_are_honoured(data_file, tmp_path):
    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    config = PrepareConfig(large_model="l", small_model="s", data=[str(data_file)], val_fraction=0.3,
                           retriever={"proj_dim": 16, "epochs": 1}, sft_epochs=1, lora_rank=0)
    prepare(config, tmp_path, large=large, small=small)
    tools = parse_tools([WEATHER, TABLE, FX])
    options = CascadeOptions(soft_token=False, retriever=False, templating=False)
    method = HyFuncMethod(large, small, Retriever.load(tmp_path / "retriever"), None, options)
    answer = method.answer([{"role": "user", "content": "Weather in Oslo?"}], tools)
    assert answer.injected_tokens == 0 and answer.output_tokens > 0 and answer.raw_text is not None
    with pytest.raises(ValueError, match="projector"):
        HyFuncMethod(large, small, Retriever.load(tmp_path / "retriever"), None)


def test_variants_share_the_large_pass(data_file, tmp_path):
    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    config = PrepareConfig(large_model="l", small_model="s", data=[str(data_file)], val_fraction=0.3,
                           retriever={"proj_dim": 16, "epochs": 1}, sft_epochs=1, lora_rank=0)
    prepare(config, tmp_path, large=large, small=small)
    method = HyFuncMethod(large, small, Retriever.load(tmp_path / "retriever"), load_projector(tmp_path))
    variant = method.variant(CascadeOptions(retriever=False), "hyfunc-no-retriever")
    tools = parse_tools([WEATHER, TABLE, FX])
    request = [{"role": "user", "content": "Weather in Oslo?"}]
    first, second = method.answer(request, tools), variant.answer(request, tools)
    assert first.reused_seconds == 0.0
    assert second.reused_seconds == first.timings["large_prefill"] == second.timings["large_prefill"] > 0
    assert second.details["ranking"] == first.details["ranking"]
    assert sorted(first.details["ranking"]) == sorted(t.name for t in tools)
    assert set(first.details["retrieved"]) <= set(first.details["ranking"])
    # another request is computed afresh
    assert variant.answer([{"role": "user", "content": "Book a table"}], tools).reused_seconds == 0.0


def test_library_benchmark_on_held_out_examples(tmp_path):
    from hyfunc.cascade.data import load_examples, split_examples
    from hyfunc.eval.library import library_examples, run_library_benchmark, write_library_report
    from hyfunc.methods.direct import DirectMethod

    rows = [dict(r, id=f"{r['id']}-{k}") for k in range(6) for r in _examples()]
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    examples, tools = library_examples([str(path)], n=3, seed=0)
    _, held_out = split_examples(load_examples([str(path)]))
    assert len(examples) == 3 and {ex.id for ex in examples} <= {ex.id for ex in held_out}
    assert len({t.name for t in tools}) == len(tools) and all(t in tools for ex in examples for t in ex.tools)
    with pytest.raises(ValueError, match="held-out"):
        library_examples([str(path)], n=1000)

    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    config = PrepareConfig(large_model="l", small_model="s", data=[str(path)], val_fraction=0.3,
                           retriever={"proj_dim": 16, "epochs": 1}, sft_epochs=1, lora_rank=0, max_examples=20)
    prepare(config, tmp_path / "artifact", large=large, small=small)
    cascade = HyFuncMethod(large, small, Retriever.load(tmp_path / "artifact" / "retriever"), load_projector(tmp_path / "artifact"))
    direct = DirectMethod(large, max_new_tokens=4, prefix_caching=True)
    result = run_library_benchmark({"hyfunc": cascade, "direct": direct}, examples, tools)
    assert result["summary"]["hyfunc"]["n"] == 3 and set(result["ratio_of_medians"]) == {"hyfunc / direct"}
    # both sides serve the library from a cache: only the request is new
    assert all(r["cached_tokens"] > 0 for recs in result["records"].values() for r in recs)
    paths = write_library_report(result, tmp_path / "report")
    assert "p50 ratio hyfunc / direct" in paths["md"].read_text() and paths["png"].stat().st_size > 0


def test_retrieval_benchmark_over_a_cached_library(data_file, tmp_path, monkeypatch):
    from hyfunc.cascade.soft_token import SoftTokenEncoder
    from hyfunc.eval.retrieval import library_requests, load_library, run_retrieval_benchmark

    monkeypatch.setenv("HYFUNC_HOME", str(tmp_path / "home"))
    library_file = tmp_path / "library.jsonl"
    library_file.write_text("\n".join(json.dumps(t) for t in [WEATHER, TABLE, FX]) + "\n")
    library = load_library(library_file)
    rows = [dict(r, id=f"{r['id']}-{k}") for k in range(6) for r in _examples()]
    many = tmp_path / "many.jsonl"
    many.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    requests = library_requests([str(many)], library)
    assert requests and all(ex.answers for ex in requests)

    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    config = PrepareConfig(large_model="l", small_model="s", data=[str(data_file)], val_fraction=0.3,
                           retriever={"proj_dim": 16, "epochs": 1}, sft_epochs=1, lora_rank=0)
    prepare(config, tmp_path / "artifact", large=large, small=small)
    retriever = Retriever.load(tmp_path / "artifact" / "retriever")
    result = run_retrieval_benchmark(SoftTokenEncoder(large), retriever, library, requests, ks=(1, 3))
    assert result["library_tools"] == 3 and result["recall@3"] == 1.0 and 0 <= result["recall@1"] <= 1
    assert result["search_ms_median"] > 0
    shards = sorted((tmp_path / "home" / "library-embeddings").rglob("*.safetensors"))
    assert len(shards) == 1
    stamp = shards[0].stat().st_mtime_ns
    run_retrieval_benchmark(SoftTokenEncoder(large), retriever, library, requests[:1], ks=(1,))
    assert shards[0].stat().st_mtime_ns == stamp  # the library is embedded once
