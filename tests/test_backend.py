import pytest
import torch

from tests.tiny_models import tiny_backend

PROMPT = "What is the weather like in Paris today?"


def test_hidden_states_shape_and_logits():
    backend = tiny_backend()
    ids = backend.encode(PROMPT)
    out = backend.forward(ids=ids)
    assert out.hidden.shape == (len(ids), backend.hidden_size)
    assert out.logits.shape == (backend.model.config.vocab_size,)
    assert out.cache.get_seq_length() == len(ids)


def test_forward_matches_the_models_own_outputs_and_keeps_tail_logits():
    backend = tiny_backend()
    ids = backend.encode(PROMPT)
    reference = backend.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    first = backend.forward(ids=ids[:5])
    assert first.tail_logits is None
    rest = backend.forward(ids=ids[5:], cache=first.cache, logits_to_keep=3)
    torch.testing.assert_close(rest.logits, reference.logits[0, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest.tail_logits, reference.logits[0, -3:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest.hidden, reference.hidden_states[-1][0, 5:], atol=1e-5, rtol=1e-5)


def test_inputs_embeds_path_matches_ids_path():
    backend = tiny_backend()
    ids = backend.encode(PROMPT)
    by_ids = backend.forward(ids=ids)
    by_embeds = backend.forward(embeds=backend.embed(ids))
    torch.testing.assert_close(by_ids.logits, by_embeds.logits)
    torch.testing.assert_close(by_ids.hidden, by_embeds.hidden)


def test_prefix_cache_reuse_gives_full_forward_logits():
    backend = tiny_backend()
    prefix = backend.encode("<|im_start|>system\nYou call tools.<|im_end|>\n")
    prefix_cache = backend.prefill(prefix)
    for request in ("Book a table for two", PROMPT):
        suffix = backend.encode(request)
        full = backend.forward(ids=prefix + suffix)
        reused = backend.forward(ids=suffix, cache=backend.fork(prefix_cache))
        torch.testing.assert_close(full.logits, reused.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(full.hidden[len(prefix):], reused.hidden, atol=1e-5, rtol=1e-5)
    # forking left the shared prefix untouched
    assert prefix_cache.get_seq_length() == len(prefix)


def test_generate_greedy_is_deterministic_and_honours_limits():
    backend = tiny_backend()
    ids = backend.encode(backend.chat_prompt([{"role": "user", "content": PROMPT}]))
    first = backend.generate(ids=ids, max_new_tokens=7)
    second = backend.generate(ids=ids, max_new_tokens=7)
    assert first.token_ids == second.token_ids
    assert len(first.token_ids) <= 7
    assert first.input_tokens == len(ids)
    stopped = backend.generate(ids=ids, max_new_tokens=7, stop=lambda text: True)
    assert len(stopped.token_ids) <= 1


def test_generate_after_cache_matches_generate_from_scratch():
    backend = tiny_backend()
    prefix = backend.encode("<|im_start|>system\nYou call tools.<|im_end|>\n")
    suffix = backend.encode(PROMPT)
    scratch = backend.generate(ids=prefix + suffix, max_new_tokens=6)
    cached = backend.generate(ids=suffix, cache=backend.fork(backend.prefill(prefix)), max_new_tokens=6)
    assert scratch.token_ids == cached.token_ids


def test_prefix_cache_reuses_the_shared_prefix_exactly():
    from hyfunc.models.backend import PrefixCache

    backend = tiny_backend()
    system = backend.encode("<|im_start|>system\nYou call tools: get_weather, book_table.<|im_end|>\n")
    prefix_cache = PrefixCache(backend)
    for request in (PROMPT, "Book a table for two", PROMPT):
        ids = system + backend.encode(request)
        scratch = backend.generate(ids=ids, max_new_tokens=5)
        reused = backend.generate(ids=ids, max_new_tokens=5, prefix_cache=prefix_cache)
        assert reused.token_ids == scratch.token_ids
        assert reused.input_tokens == len(ids)
    # the third prompt repeats the first after a different one: only the system prompt is shared
    assert reused.cached_tokens >= len(system) - 1
    again = backend.generate(ids=ids, max_new_tokens=5, prefix_cache=prefix_cache)
    assert again.cached_tokens == len(ids) - 1 and again.token_ids == scratch.token_ids


def test_prefix_cache_stays_exact_after_a_pass_given_up():
    from hyfunc.models.base import PrefixCache
    from hyfunc.models.interrupt import Interrupted, stop_when

    backend = tiny_backend()
    system = backend.encode("<|im_start|>system\nYou call tools: get_weather, book_table.<|im_end|>\n")
    long_request = system + backend.encode("Book a table for two at eight tonight, near the station")
    prefix_cache = PrefixCache(backend)
    prefix_cache.run(long_request)
    # The next prompt shares the system prompt only: the cache is cropped to it, then the pass is given up.
    with stop_when(lambda: True), pytest.raises(Interrupted):
        prefix_cache.run(system + backend.encode(PROMPT))
    # The same long prompt again: it shares only what the cropped cache still holds, and answers as from scratch.
    step, reused = prefix_cache.run(long_request)
    assert reused <= len(system)
    assert torch.equal(torch.argmax(step.logits), torch.argmax(backend.forward(ids=long_request).logits))
    torch.testing.assert_close(step.logits, backend.forward(ids=long_request).logits, rtol=1e-4, atol=1e-4)
