"""The same backend contract on both engines, on the real SmolLM2-135M GGUF (transformers runs its
dequantised weights, llama.cpp the GGUF itself): agreement, input embeddings, KV fork/crop equal
to recomputation, batched lines, templating, a LoRA adapter merged into the GGUF, and a thread whose
work was given up stopping before its next step."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from hyfunc.cascade.templating import TemplateDecoder
from hyfunc.formats.schema import parse_tools
from hyfunc.formats.validate import argument_errors
from hyfunc.models.backend import Backend
from hyfunc.models.interrupt import Interrupted, stop_when
from hyfunc.models.llamacpp import LlamaCppBackend, llama_cpp_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not llama_cpp_available(), reason="llama-cpp-python is not installed (make llamacpp)"),
]
MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def llama() -> LlamaCppBackend:
    return LlamaCppBackend(MODEL, n_ctx=2048, n_seq=8)


@pytest.fixture(scope="module")
def torch_fp32() -> Backend:
    return Backend(MODEL, dtype=torch.float32)


@pytest.fixture(scope="module")
def ids(llama) -> list[int]:
    return llama.encode(llama.chat_prompt([{"role": "user", "content": "What is the weather like in Paris today?"}]))


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


def test_same_tokens_and_prompts_on_both_engines(llama, torch_fp32, ids):
    text = torch_fp32.chat_prompt([{"role": "user", "content": "What is the weather like in Paris today?"}])
    assert torch_fp32.encode(text) == ids
    assert llama.eos_ids & torch_fp32.eos_ids


def test_logits_and_hidden_states_agree_with_transformers(llama, torch_fp32, ids):
    ref = torch_fp32.forward(ids=ids, logits_to_keep=3)
    out = llama.forward(ids=ids, logits_to_keep=3, output_hidden=True)
    assert out.hidden.shape == ref.hidden.shape and out.tail_logits.shape == ref.tail_logits.shape
    assert _cos(out.hidden, ref.hidden).min() > 0.99  # llama.cpp quantises activations in its matmuls
    assert _cos(out.tail_logits, ref.tail_logits).min() > 0.99
    assert int(out.logits.argmax()) == int(ref.logits.argmax())
    assert llama.forward(ids=ids).hidden is None  # hidden states only when asked


@pytest.mark.parametrize("engine", ["llama", "torch_fp32"])
def test_hidden_states_of_the_last_positions_only(engine, ids, request):
    backend = request.getfixturevalue(engine)
    every = backend.forward(ids=ids, logits_to_keep=3, output_hidden=True)
    last = backend.forward(ids=ids, logits_to_keep=3, output_hidden=True, hidden_to_keep=2)
    assert last.hidden.shape == (2, every.hidden.shape[1])
    assert _cos(last.hidden, every.hidden[-2:]).min() > 0.9999
    assert _cos(last.tail_logits, every.tail_logits).min() > 0.9999
    # The KV cache holds every position either way: the next token sees the same past.
    after = [backend.forward(ids=ids[:2], cache=out.cache).logits for out in (every, last)]
    assert _cos(after[0], after[1]) > 0.9999


@pytest.mark.parametrize("engine", ["llama", "torch_fp32"])
def test_a_given_up_thread_stops_before_its_next_step_and_its_cache_is_untouched(engine, ids, request):
    backend = request.getfixturevalue(engine)
    prefix = backend.forward(ids=ids[:4]).cache
    held = backend.fork(prefix)
    given_up = threading.Event()
    with stop_when(given_up.is_set):
        expected = backend.forward(ids=ids[4:6], cache=backend.fork(prefix)).logits  # not given up yet: runs
        given_up.set()
        with pytest.raises(Interrupted):
            backend.forward(ids=ids[4:6], cache=held)
        with pytest.raises(Interrupted):
            backend.hidden_of_lines(prefix, [ids[4:6], ids[6:8]])
        elsewhere: list = []  # another thread registered nothing: never stopped
        thread = threading.Thread(target=lambda: elsewhere.append(backend.forward(ids=ids[4:6], cache=backend.fork(prefix))))
        thread.start()
        thread.join()
        assert len(elsewhere) == 1
    # The refused pass ran nothing: `held` still holds the prefix alone; outside the block steps run again.
    assert _cos(backend.forward(ids=ids[4:6], cache=held).logits, expected) > 0.9999


def test_input_embeddings_equal_the_tables_and_the_ids_path(llama, torch_fp32, ids):
    torch.testing.assert_close(llama.embed(ids[:6]), torch_fp32.embed(ids[:6]).float(), rtol=0, atol=1e-6)
    by_ids = llama.forward(ids=ids)
    by_embeds = llama.forward(embeds=llama.embed(ids))
    assert _cos(by_ids.logits, by_embeds.logits) > 0.9999
    assert int(by_ids.logits.argmax()) == int(by_embeds.logits.argmax())


def test_fork_and_crop_equal_recomputation(llama, ids):
    full = llama.forward(ids=ids, logits_to_keep=2).tail_logits
    prefix = llama.prefill(ids[:-5])
    assert prefix.get_seq_length() == len(ids) - 5
    for _ in range(2):  # the prefix stays reusable: each fork extends its own sequence
        forked = llama.fork(prefix)
        step = llama.forward(ids=ids[-5:], cache=forked, logits_to_keep=2)
        torch.testing.assert_close(step.tail_logits, full, rtol=1e-3, atol=1e-3)
        assert forked.get_seq_length() == len(ids) and prefix.get_seq_length() == len(ids) - 5
    # Drafted tokens rejected: crop them away and run the true continuation.
    kv = llama.fork(prefix)
    llama.forward(ids=[11, 12, 13], cache=kv)
    kv.crop(-3)
    again = llama.forward(ids=ids[-5:], cache=kv, logits_to_keep=2)
    torch.testing.assert_close(again.tail_logits, full, rtol=1e-3, atol=1e-3)


def test_sequences_are_recycled(llama, ids):
    prefix = llama.prefill(ids[:4])
    for _ in range(3 * 8):  # more forks than sequences: each is released when dropped
        llama.forward(ids=ids[4:6], cache=llama.fork(prefix))


def test_lines_in_one_batch_equal_each_line_alone(llama, ids):
    prefix = llama.prefill(ids[:8])
    lines = [ids[8:12], ids[8:10], ids[10:15]]
    batched = llama.hidden_of_lines(prefix, lines)
    for line, hidden in zip(lines, batched):
        alone = llama.forward(ids=line, cache=llama.fork(prefix), output_hidden=True).hidden
        assert hidden.shape == alone.shape and _cos(hidden, alone).min() > 0.9999


def test_greedy_generation_with_a_prefix_cache_equals_without(llama, ids):
    from hyfunc.models.base import PrefixCache

    plain = llama.generate(ids=ids, max_new_tokens=12)
    cache = PrefixCache(llama)
    llama.generate(ids=ids[:-2] + [11, 12], max_new_tokens=4, prefix_cache=cache)
    reused = llama.generate(ids=ids, max_new_tokens=12, prefix_cache=cache)
    assert reused.cached_tokens == len(ids) - 2 and reused.token_ids == plain.token_ids and plain.token_ids


TOOLS = parse_tools([
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer"}},
        "required": ["city"]}}},
])


def test_templating_on_llamacpp_is_schema_valid(llama):
    prompt = llama.encode(llama.chat_prompt([{"role": "user", "content": "Weather in Paris for 3 days, in celsius?"}]))
    out = TemplateDecoder(llama).decode(llama.forward(ids=prompt), TOOLS, require_call=True, draft_source="Weather in Paris for 3 days, in celsius?")
    assert out.calls and all(c.name == "get_weather" for c in out.calls)
    assert all(not argument_errors(c, TOOLS) for c in out.calls)
    assert json.loads(out.text) == [{"name": c.name, "arguments": c.arguments} for c in out.calls]


def test_lora_adapter_merged_into_the_gguf_equals_the_merged_model(tmp_path, torch_fp32, ids):
    from peft import LoraConfig, get_peft_model

    from hyfunc.models.gguf_lora import merge_adapter

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    base = Backend(MODEL, dtype=torch.float32)
    peft_model = get_peft_model(base.model, config)
    for name, param in peft_model.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.05)
    peft_model.save_pretrained(tmp_path / "adapter")
    merged = peft_model.merge_and_unload().eval()
    ref = Backend(MODEL, model=merged, tokenizer=base.tokenizer).forward(ids=ids, logits_to_keep=4).tail_logits
    before = torch_fp32.forward(ids=ids, logits_to_keep=4).tail_logits
    base_llama = LlamaCppBackend(MODEL, n_ctx=512, n_seq=2)
    gguf = merge_adapter(tmp_path / "adapter", base_llama.gguf_path, tmp_path / "merged.gguf")
    plain = base_llama.forward(ids=ids, logits_to_keep=4).tail_logits
    adapted = LlamaCppBackend(MODEL, n_ctx=512, n_seq=2, gguf=gguf).forward(ids=ids, logits_to_keep=4).tail_logits
    # The two engines differ by rounding noise; the adapter's effect on the logits must be the same
    # change on both: llama.cpp running the merged GGUF vs transformers running the merged weights.
    effect_llama, effect_torch = (adapted - plain).flatten(), (ref - before).flatten()
    assert effect_torch.norm() > 2 * (plain - before).norm()  # an effect well above the engines' noise
    assert _cos(effect_llama, effect_torch) > 0.95
    assert abs(effect_llama.norm() / effect_torch.norm() - 1) < 0.25  # alpha / r applied: 0.85 measured; 0.5 if not


def test_a_default_model_runs_in_the_gguf_type_its_registry_entry_names(monkeypatch, llama, ids):
    import dataclasses

    from hyfunc.models import llamacpp, registry

    shipped = llama.gguf_path
    assert llamacpp.engine_gguf(MODEL) == shipped  # no type named: the shipped file as is
    spec = dataclasses.replace(registry.DEFAULT_MODELS[MODEL], llamacpp_type="q8_0")
    monkeypatch.setitem(registry.DEFAULT_MODELS, MODEL, spec)
    requantized = llamacpp.engine_gguf(MODEL)
    try:
        from gguf import GGUFReader, GGMLQuantizationType

        assert requantized == shipped.with_name(f"{MODEL}.q8_0.gguf")
        types = {t.tensor_type for t in GGUFReader(requantized).tensors if t.name.endswith("ffn_up.weight")}
        assert types == {GGMLQuantizationType.Q8_0}
        made = requantized.stat().st_mtime_ns
        assert llamacpp.engine_gguf(MODEL) == requantized and requantized.stat().st_mtime_ns == made  # made once
        backend = LlamaCppBackend(MODEL, n_ctx=512, n_seq=2)
        assert backend.gguf_path == requantized and "q8_0" in backend.description
        # Q8_0 holds the shipped Q4_1 values closely: nearly the same logits, each top token among the other's top 3.
        ours, theirs = backend.forward(ids=ids, logits_to_keep=4).tail_logits, llama.forward(ids=ids, logits_to_keep=4).tail_logits
        assert _cos(ours, theirs).min() > 0.99
        assert all(int(o.argmax()) in t.topk(3).indices.tolist() for o, t in zip(ours, theirs))
    finally:
        requantized.unlink(missing_ok=True)


def test_an_unknown_gguf_type_is_a_clear_error(tmp_path, llama):
    from hyfunc.models.llamacpp import requantize_gguf
    from hyfunc.models.registry import ModelNotAvailable

    with pytest.raises(ModelNotAvailable, match="no GGUF type 'q9_9'"):
        requantize_gguf(llama.gguf_path, tmp_path / "x.gguf", "q9_9")
    assert not list(tmp_path.iterdir())


def test_merged_models_are_cached_by_adapter_and_the_least_recently_used_evicted(tmp_path, monkeypatch, llama):
    from peft import LoraConfig, get_peft_model

    from hyfunc.models import gguf_lora

    monkeypatch.setenv("HYFUNC_HOME", str(tmp_path / "home"))
    adapters = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = get_peft_model(Backend(MODEL, dtype=torch.float32).model, LoraConfig(r=2, target_modules=["q_proj"]))
        adapters.append(tmp_path / f"run{seed}" / "adapter")
        model.save_pretrained(adapters[-1])
    first = gguf_lora.cached_merged_gguf(adapters[0], llama.gguf_path)
    made = first.stat().st_ino
    monkeypatch.setattr(gguf_lora, "MERGED_CACHE_BYTES", first.stat().st_size * 3 // 2)  # room for one
    assert gguf_lora.cached_merged_gguf(adapters[0], llama.gguf_path).stat().st_ino == made  # merged once
    second = gguf_lora.cached_merged_gguf(adapters[1], llama.gguf_path)
    assert second != first and second.is_file() and not first.exists()  # one kept: the older evicted
    assert not list(second.parent.parent.rglob("*.tmp"))  # no half-written model left


def test_an_adapter_for_weights_the_model_lacks_is_refused(tmp_path, llama):
    from peft import LoraConfig, get_peft_model

    from hyfunc.models.gguf_lora import AdapterNotConvertible, merge_adapter

    model = get_peft_model(Backend(MODEL, dtype=torch.float32).model, LoraConfig(r=2, target_modules=["q_proj"]))
    model.save_pretrained(tmp_path / "adapter")
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    extra = {k.replace("layers.0.", "layers.99."): v.clone() for k, v in tensors.items() if "layers.0." in k}
    save_file({**tensors, **extra}, tmp_path / "adapter" / "adapter_model.safetensors")
    with pytest.raises(AdapterNotConvertible, match="match no weight"):
        merge_adapter(tmp_path / "adapter", llama.gguf_path, tmp_path / "merged.gguf")
