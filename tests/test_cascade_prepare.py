"""The whole offline preparation and the online cascade, on tiny random models and toy data."""
import json

import pytest
import torch

from hyfunc.methods.cascade import CascadeOptions, HyFuncMethod
from hyfunc.cascade.prepare import PrepareConfig, prepare
from hyfunc.cascade.retriever import Retriever
from hyfunc.cascade.shards import read_shards
from hyfunc.cascade.small_model import load_projector
from hyfunc.cascade.soft_token import SoftTokenEncoder
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
    for i in range(4):  # two calls: after the first one's result, the next step is a call
        rows.append({"id": f"ww{i}", "query": f"Weather in city {i} and in city {i + 1}?", "tools": [WEATHER, FX],
                     "answers": [{"name": "get_weather", "arguments": {"city": f"city {j}"}} for j in (i, i + 1)]})
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
        shard_size=4, retriever={"proj_dim": 16, "epochs": 3, "lr": 1e-2, "refusal_head": True}, sft_epochs=1, lora_rank=4, sft_grad_accum=2,
        repeat_fraction=0.2, schema_fraction=0.5,
    )
    out = tmp_path / "artifact"
    manifest = prepare(config, out, large=large, small=small)
    embedded = {i for held, _ in read_shards(out / "embeddings") for i in held}
    assert any("~and~" in i for i in embedded)  # repeated-call examples joined from the data
    assert any("~schema-" in i for i in embedded)  # schema variants of training requests
    assert not any(i.startswith("chatterbot-") for i in embedded)  # small talk trains the gate, not the refusal head

    for path in ("manifest.json", "retriever/manifest.json", "projector.safetensors", "adapter", "sft/state.json",
                 "off_topic/manifest.json", "next_step/manifest.json"):
        assert (out / path).exists(), path
    assert manifest["data"]["train"] + manifest["data"]["validation"] >= 21
    assert manifest["metrics"]["sft"]["items"] > 0 and len(manifest["metrics"]["sft"]["epoch_losses"]) == 1
    assert set(manifest["metrics"]["retriever"]["validation"]) >= {"recall@1", "exact_set_accuracy"}
    assert Retriever.load(out / "retriever").refusal is not None  # trained on the refusal examples added to the data
    # the keep threshold was re-chosen by the small model's calls on validation: the best point of its curve
    end_to_end = manifest["metrics"]["retriever"]["end_to_end"]
    assert Retriever.load(out / "retriever").config.threshold == end_to_end["threshold"]
    assert end_to_end["requests"] > 0 and 0 < end_to_end["decodes"] <= end_to_end["requests"] * 8
    counts = [count for _, count in end_to_end["curve"]]
    assert end_to_end["exact_calls"] == max(counts) and all(0 <= c <= end_to_end["requests"] for c in counts)
    assert end_to_end["exact_calls"] >= end_to_end["exact_calls_at_retrieval_threshold"]

    # resuming recomputes nothing: shards and the retriever are reused as they are
    shards = sorted((out / "embeddings").glob("*.safetensors"))
    stamps = [p.stat().st_mtime_ns for p in shards]
    retriever_stamp = (out / "retriever" / "retriever.safetensors").stat().st_mtime_ns
    gate_stamp = (out / "off_topic" / "gate.safetensors").stat().st_mtime_ns
    assert manifest["metrics"]["off_topic_gate"]["validation"]["off_topic_requests"] > 0
    resumed = prepare(config, out, large=large, small=tiny_backend(hidden_size=32, seed=2))
    assert [p.stat().st_mtime_ns for p in shards] == stamps
    assert manifest["earlier_runs"] == [] and resumed["earlier_runs"] == [{"seconds": manifest["seconds"]}]
    assert (out / "retriever" / "retriever.safetensors").stat().st_mtime_ns == retriever_stamp
    assert (out / "off_topic" / "gate.safetensors").stat().st_mtime_ns == gate_stamp

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
    config = PrepareConfig(large_model="l", small_model="s", data=[str(data_file)], val_fraction=0.3, off_topic_gate=False,
                           retriever={"proj_dim": 16, "epochs": 1}, sft_epochs=1, lora_rank=0)
    prepare(config, tmp_path, large=large, small=small)
    retriever = Retriever.load(tmp_path / "retriever")
    retriever.config.refusal_threshold = 2.0  # above any cosine: always refuse
    method = HyFuncMethod(large, small, retriever, load_projector(tmp_path))
    answer = method.answer([{"role": "user", "content": "Tell me a joke"}], parse_tools([FX]))
    assert answer.calls == [] and "small_decode" not in answer.timings and "small_prefill" not in answer.timings
    assert answer.details["answerability"] < 2.0  # what the refusal read is recorded


def test_ablation_switches_are_honoured(data_file, tmp_path):
    large, small = tiny_backend(hidden_size=48, seed=1), tiny_backend(hidden_size=32, seed=2)
    config = PrepareConfig(large_model="l", small_model="s", data=[str(data_file)], val_fraction=0.3, off_topic_gate=False,
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
    config = PrepareConfig(large_model="l", small_model="s", data=[str(data_file)], val_fraction=0.3, off_topic_gate=False,
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
    # without the small model, the large model writes the calls on from its own (shared) pass
    large_only = method.variant(CascadeOptions(retriever=False, small_model=False), "hyfunc-large-only")
    written = large_only.answer(request, tools)
    assert written.reused_seconds > 0 and "small_prefill" not in written.timings and written.timings["large_decode"] > 0
    assert written.details["large_forward_passes"] > 0 and {c.name for c in written.calls} <= {t.name for t in tools}
    # another request is computed afresh
    assert variant.answer([{"role": "user", "content": "Book a table"}], tools).reused_seconds == 0.0

    # another cascade (here: another small model) on the same large model shares the pass too
    other = HyFuncMethod(large, tiny_backend(hidden_size=32, seed=3), Retriever.load(tmp_path / "retriever"), None,
                         CascadeOptions(soft_token=False))
    method.share_large_pass(other)
    third, fourth = method.answer(request, tools), other.answer(request, tools)
    assert third.reused_seconds == 0.0 and fourth.reused_seconds == third.timings["large_prefill"] > 0
    with pytest.raises(ValueError, match="same loaded large model"):
        method.share_large_pass(HyFuncMethod(tiny_backend(hidden_size=48, seed=1), small, Retriever.load(tmp_path / "retriever"), None,
                                             CascadeOptions(soft_token=False)))


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
    config = PrepareConfig(large_model="l", small_model="s", data=[str(path)], val_fraction=0.3, off_topic_gate=False,
                           retriever={"proj_dim": 16, "epochs": 1}, sft_epochs=1, lora_rank=0, max_examples=20)
    prepare(config, tmp_path / "artifact", large=large, small=small)
    cascade = HyFuncMethod(large, small, Retriever.load(tmp_path / "artifact" / "retriever"), load_projector(tmp_path / "artifact"))
    direct = DirectMethod(large, max_new_tokens=4, prefix_caching=True)
    # an ablation (`hyfunc bench library --ablations`) reads the library too and reuses each request's large pass
    ablation = cascade.variant(CascadeOptions.without("templating"), "hyfunc-no-templating")
    result = run_library_benchmark({"hyfunc": cascade, "hyfunc-no-templating": ablation, "direct": direct}, examples, tools)
    assert result["summary"]["hyfunc"]["n"] == 3
    assert set(result["ratio_of_medians"]) == {"hyfunc / direct", "hyfunc / hyfunc-no-templating"}
    # every side serves the library from a cache: only the request is new
    assert all(r["cached_tokens"] > 0 for recs in result["records"].values() for r in recs)
    for main, variant in zip(result["records"]["hyfunc"], result["records"]["hyfunc-no-templating"]):
        assert variant["reused_seconds"] == main["timings"]["large_prefill"] > 0 == main["reused_seconds"]
        assert variant["latency"] >= variant["reused_seconds"]
    paths = write_library_report(result, tmp_path / "report")
    md = paths["md"].read_text()
    assert "p50 ratio hyfunc / direct" in md and "Mean seconds per stage" in md and paths["png"].stat().st_size > 0


def test_library_retriever_benchmark_and_per_function_serving(data_file, tmp_path, monkeypatch):
    from hyfunc.cascade.library import load_library
    from hyfunc.eval.retrieval import library_requests, run_retrieval_benchmark, write_retrieval_report

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
    config = PrepareConfig(large_model="l", small_model="s", data=[str(data_file)], val_fraction=0.3, off_topic_gate=False,
                           retriever={"proj_dim": 16, "epochs": 1, "refusal_head": True}, sft_epochs=1, lora_rank=0, library=str(library_file))
    manifest = prepare(config, tmp_path / "artifact", large=large, small=small)
    lib_metrics = manifest["metrics"]["library_retriever"]
    # library requests all call a tool: no refusal head to train there, the cosine decides
    assert Retriever.load(tmp_path / "artifact" / "library_retriever").refusal is None
    assert lib_metrics["train_examples"] > 0 and "recall@1" in lib_metrics["validation"]
    joint = Retriever.load(tmp_path / "artifact" / "retriever")
    per_function = Retriever.load(tmp_path / "artifact" / "library_retriever")
    assert per_function.meta["library"]["tools"] == 3 and per_function.config.per_sentence
    assert list((tmp_path / "artifact" / "library-sentences").glob("*.safetensors"))  # cached per-sentence tokens

    assert "lexical_fit" in lib_metrics
    # whatever the toy holdouts chose: one fused retriever, one on its cosine alone
    per_function.config.lexical_weight, joint.config.lexical_weight = 1.0, 0.0
    retrievers = {"joint": joint, "library": per_function}
    result = run_retrieval_benchmark(SoftTokenEncoder(large), retrievers, library, requests, ks=(1, 3))
    # a fused retriever's parts are reported too: the cosine alone and the lexical scores alone
    assert set(result["retrievers"]) == {"joint", "library", "library, cosine only", "lexical only (BM25 per sentence)"}
    for metrics in result["retrievers"].values():
        assert metrics["recall@3"] == 1.0 and 0 <= metrics["recall@1"] <= 1 and metrics["search_ms_median"] > 0
    paths = write_retrieval_report(result, tmp_path / "report", ks=(1, 3))
    assert "| library |" in paths["md"].read_text() and paths["png"].stat().st_size > 0
    shards = sorted((tmp_path / "home" / "library-embeddings").rglob("*.safetensors"))
    assert len(shards) == 1  # embedded once, by prepare; the benchmark reused it
    stamp = shards[0].stat().st_mtime_ns
    run_retrieval_benchmark(SoftTokenEncoder(large), retrievers, library, requests[:1], ks=(1,))
    assert shards[0].stat().st_mtime_ns == stamp

    # serving a library larger than a prompt: per-function mode with the library retriever
    monkeypatch.setattr(HyFuncMethod, "MAX_PROMPT_TOOLS", 2)
    method = HyFuncMethod(large, small, joint, load_projector(tmp_path / "artifact"), library_retriever=per_function)
    method.use_library(library)
    for request in ("What is the weather in Oslo?", "What is the weather in Oslo? Then convert 20 USD to EUR please."):
        answer = method.answer([{"role": "user", "content": request}], library)  # one sentence, then two
        assert answer.cached_tokens > 0 and set(answer.details["ranking"]) == {t.name for t in library}
        for call in answer.calls:
            assert argument_errors(call, library) == []
    without = HyFuncMethod(large, small, joint, load_projector(tmp_path / "artifact"))
    with pytest.raises(ValueError, match="library retriever"):
        without.use_library(library)


def test_balanced_sample_and_refusal_examples():
    from hyfunc.cascade.data import augment_refusals, call_pattern, sample_by_pattern
    from hyfunc.cascade.data import Example
    from hyfunc.formats.calls import Call

    tools = parse_tools([WEATHER, TABLE, FX])
    one = lambda i: Example(f"s{i}", "t", "q", tools, [Call("get_weather", {"city": "x"})])  # noqa: E731
    rows = [one(i) for i in range(90)]
    rows += [Example(f"r{i}", "t", "q", tools, [Call("get_weather", {"city": "a"}), Call("get_weather", {"city": "b"})]) for i in range(5)]
    rows += [Example(f"n{i}", "t", "q", tools, []) for i in range(5)]
    sample = sample_by_pattern(rows, 30, seed=0)
    patterns = [call_pattern(ex) for ex in sample]
    assert len(sample) == 30 and patterns.count("repeated") == 5 and patterns.count("none") == 5
    assert sample == sorted(sample, key=rows.index) and sample_by_pattern(rows, 30, seed=0) == sample
    assert sample_by_pattern(rows, 200, seed=0) == rows

    augmented = augment_refusals(rows[:20], 0.5, seed=0)
    extra = augmented[20:]
    assert extra and all(ex.answers == [] for ex in extra)
    near = [ex for ex in extra if ex.source == "augmented-near-miss"]
    assert near and all("get_weather" not in {t.name for t in ex.tools} and ex.tools for ex in near)
    assert [ex.id for ex in augment_refusals(rows[:20], 0.5, seed=0)[20:]] == [ex.id for ex in extra]


def test_off_topic_requests_come_from_the_chatterbot_corpus():
    from hyfunc.cascade.data import off_topic_requests, split_examples

    requests = off_topic_requests()
    assert len(requests) > 500 and len({ex.id for ex in requests}) == len(requests)
    assert all(ex.query.strip() and ex.tools == [] and ex.answers == [] for ex in requests)
    train, val = split_examples(requests)
    assert train and val and off_topic_requests() == requests


def test_repeated_call_examples_join_requests_for_the_same_tool(data_file):
    from hyfunc.cascade.data import Example, call_pattern, load_examples, repeated_examples
    from hyfunc.formats.calls import Call

    pool = load_examples(data_file)
    made = repeated_examples(pool, 12, seed=0)
    by_id = {ex.id: ex for ex in pool}
    assert made and len({ex.id for ex in made}) == len(made) <= 12
    for ex in made:
        parts = [by_id[i] for i in ex.id.split("~and~")]
        assert 2 <= len(parts) <= 3 and call_pattern(ex) == "repeated"
        assert ex.answers == [c for p in parts for c in p.answers]  # one call per request, in order
        assert ex.query == " ".join(p.query for p in parts)
        assert {c.name for c in ex.answers} <= {t.name for t in ex.tools}
    assert [ex.id for ex in repeated_examples(pool, 12, seed=0)] == [ex.id for ex in made]

    tools = parse_tools([WEATHER])
    same = [Example(f"s{i}", "t", "q", tools, [Call("get_weather", {"city": "x"})]) for i in range(2)]
    assert repeated_examples(same, 5, seed=0) == []  # the same call twice would teach a loop
    assert repeated_examples(pool[:1] + [ex for ex in pool if not ex.answers], 5, seed=0) == []  # no pair


def test_embeddings_are_cached_by_example_id(data_file, tmp_path):
    from hyfunc.cascade.data import load_examples
    from hyfunc.cascade.prepare import compute_embeddings, load_embeddings

    examples = load_examples([str(data_file)])
    encoder = SoftTokenEncoder(tiny_backend(hidden_size=48, seed=1))
    compute_embeddings(encoder, examples[:8], tmp_path, shard_size=4)
    first = sorted(tmp_path.glob("*.safetensors"))
    stamps = [p.stat().st_mtime_ns for p in first]
    compute_embeddings(encoder, examples[4:12], tmp_path, shard_size=4)  # half new: one shard added
    assert [p.stat().st_mtime_ns for p in first] == stamps and len(list(tmp_path.glob("*.safetensors"))) == 3
    loaded = load_embeddings(tmp_path, {ex.id for ex in examples[2:10]})
    assert set(loaded) == {ex.id for ex in examples[2:10]}
    soft, functions = loaded[examples[9].id]
    assert functions.shape == (len(examples[9].tools), 48)
    assert torch.allclose(soft, encoder.encode(examples[9].query, examples[9].tools).soft_token, atol=1e-5)
