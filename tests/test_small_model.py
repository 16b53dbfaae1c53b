import pytest
import torch

from hyfunc.cascade.small_model import (
    SoftTokenProjector,
    build_small_prompt,
    load_projector,
    prompt_embeds,
    save_projector,
    soft_prefix_loss,
)
from hyfunc.formats.schema import parse_tools
from tests.tiny_models import tiny_backend

TOOLS = parse_tools([{"name": "get_weather", "description": "Weather of a city",
                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}])
REQUEST = "What is the weather like in Paris today?"
LARGE_HIDDEN = 48


def test_soft_token_sits_right_after_the_request():
    backend = tiny_backend()
    projector = SoftTokenProjector(LARGE_HIDDEN, backend.hidden_size)
    prompt = build_small_prompt(backend, REQUEST, TOOLS)
    assert backend.decode(prompt.before_ids).rstrip().endswith(REQUEST)
    assert backend.decode(prompt.after_ids).strip() == "assistant"  # special tokens are skipped on decode
    soft = torch.randn(LARGE_HIDDEN)
    embeds = prompt_embeds(backend, projector, prompt, soft)
    assert embeds.shape == (len(prompt), backend.hidden_size)
    table = backend.model.get_input_embeddings()
    torch.testing.assert_close(embeds[prompt.soft_position], projector(soft))
    torch.testing.assert_close(embeds[: prompt.soft_position], table(torch.tensor(prompt.before_ids)))
    torch.testing.assert_close(embeds[prompt.soft_position + 1 :], table(torch.tensor(prompt.after_ids)))
    # without a soft token the prompt is the plain rendered chat
    plain = build_small_prompt(backend, REQUEST, TOOLS, with_soft_token=False)
    assert plain.after_ids == [] and backend.decode(plain.before_ids).count(REQUEST) == 1
    assert prompt_embeds(backend, projector, plain, None).shape == (len(plain), backend.hidden_size)
    with pytest.raises(ValueError, match="without a slot"):
        prompt_embeds(backend, projector, plain, soft)


def test_training_the_projector_and_model_reduces_the_loss_on_generated_tokens_only():
    backend = tiny_backend(seed=1)
    projector = SoftTokenProjector(LARGE_HIDDEN, backend.hidden_size)
    prompt = build_small_prompt(backend, REQUEST, TOOLS)
    soft = torch.randn(LARGE_HIDDEN)
    target = backend.encode('[{"name": "get_weather", "arguments": {"city": "Paris"}}]')
    mask = [False] * len(target)
    mask[-6:-3] = [True] * 3  # pretend only the value tokens are generated
    params = list(projector.parameters()) + list(backend.model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(25):
        loss = soft_prefix_loss(backend, projector, prompt, soft, target, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert projector.proj.weight.grad is not None and projector.proj.weight.grad.abs().sum() > 0
    # injected tokens carry no loss
    assert soft_prefix_loss(backend, projector, prompt, soft, target, [False] * len(target)).item() == 0.0


def test_projector_save_load_round_trip(tmp_path):
    projector = SoftTokenProjector(LARGE_HIDDEN, 32)
    save_projector(projector, tmp_path)
    loaded = load_projector(tmp_path)
    x = torch.randn(LARGE_HIDDEN)
    torch.testing.assert_close(loaded(x), projector(x))
