"""The off-topic gate: trained on fc-train requests against the ChatterBot corpus (real MiniLM, a tiny
random large model's soft tokens), calibrated on the validation split, saved and loaded; in the
cascade it refuses only where both detectors agree, and the router sends what it suspects to the cascade."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hyfunc.cascade.data import load_examples
from hyfunc.cascade.off_topic import OffTopicConfig, OffTopicGate, gate_rates, train_gate
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import CascadeOptions
from hyfunc.models.minilm import MiniLMEmbedder
from tests.serve_app import LARGE_HIDDEN, tiny_cascade
from tests.test_serve_sdk import TOOLS
from tests.test_small_path import fc_subset
from tests.tiny_models import tiny_backend

JOKE = [{"role": "user", "content": "Tell me a joke about cats."}]
# A request done: its call, the result and a text reply (what a follow-up comes after).
WEATHER_ANSWERED = [
    {"role": "user", "content": "What's the weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 12, "sky": "rain"}'},
    {"role": "assistant", "content": "12 degrees and rain in Oslo."},
]


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, embedder: MiniLMEmbedder) -> tuple[OffTopicGate, Path]:
    root = tmp_path_factory.mktemp("gate")
    examples = load_examples([fc_subset(root / "data", 300)])
    encoder = SoftTokenEncoder(tiny_backend(LARGE_HIDDEN, seed=1))
    gate = train_gate(examples, lambda query, tools: encoder.encode(query, tools).soft_token, "tiny",
                      OffTopicConfig(max_false_refusals=0.05), embedder=embedder, max_per_class=40, max_val_calls=40)
    return gate, gate.save(root / "off_topic")


def test_gate_is_calibrated_on_the_validation_call_requests(trained: tuple[OffTopicGate, Path]) -> None:
    gate, _ = trained
    val = gate.config.metrics["validation"]
    assert val["call_requests"] > 0 and val["off_topic_requests"] > 0
    # Each threshold is the 5 % quantile of the validation call requests' scores.
    assert val["call_refused_by_minilm"] <= 0.05 + 1e-9 and val["call_refused_by_head"] <= 0.05 + 1e-9
    assert val["call_refused_by_gate"] <= min(val["call_refused_by_minilm"], val["call_refused_by_head"])
    # MiniLM is real: requests for no tool are far from fc-train's tools.
    assert val["off_topic_refused_by_minilm"] > 0.5
    assert gate.config.large_model == "tiny" and gate.config.metrics["train"]["off_topic_requests"] == 40


def test_saved_gate_loads_with_the_same_decisions(trained: tuple[OffTopicGate, Path], embedder: MiniLMEmbedder) -> None:
    gate, directory = trained
    loaded = OffTopicGate.load(directory, embedder)
    tools = parse_tools(TOOLS)
    request = JOKE[0]["content"]
    assert loaded.best_cosine(request, tools) == pytest.approx(gate.best_cosine(request, tools))
    tokens = torch.randn(3, LARGE_HIDDEN)
    assert torch.allclose(loaded.head_logits(tokens), gate.head_logits(tokens))
    assert loaded.config.cosine_threshold == gate.config.cosine_threshold
    with pytest.raises(ValueError, match="trained on all-MiniLM-L6-v2"):
        OffTopicGate.load(directory, embedder=type("Other", (), {"name": "other"})())
    with pytest.raises(FileNotFoundError, match="not a saved off-topic gate"):
        OffTopicGate.load(directory.parent)
    assert not loaded.suspects(request, [])  # nothing offered: nothing to gate


def _gate(cosine: float, head: float, embedder: MiniLMEmbedder, dismiss: float = -1.0) -> OffTopicGate:
    """A gate whose head reads every soft token as 0 (zero weights): the thresholds decide."""
    zeros = torch.zeros(LARGE_HIDDEN)
    return OffTopicGate(zeros, torch.zeros(()), zeros, torch.ones(LARGE_HIDDEN),
                        OffTopicConfig(cosine_threshold=cosine, head_threshold=head, dismiss_threshold=dismiss), embedder)


@pytest.mark.parametrize("cosine, head, refused", [(2.0, 1.0, True), (2.0, -1.0, False), (-2.0, 1.0, False)])
def test_cascade_refuses_only_where_both_detectors_agree(cosine: float, head: float, refused: bool,
                                                          embedder: MiniLMEmbedder) -> None:
    cascade = tiny_cascade()
    cascade.gate = _gate(cosine, head, embedder)
    answer = cascade.answer(JOKE, parse_tools(TOOLS))
    assert (answer.calls == [] and answer.details.get("refused_by") == "off_topic_gate") is refused
    assert "gate" in answer.timings and "large_prefill" in answer.timings
    if refused:  # the ablation without the gate answers the same request
        ungated = cascade.variant(CascadeOptions(off_topic_gate=False), "no-gate")
        assert ungated.answer(JOKE, parse_tools(TOOLS)).calls


def test_gate_dismisses_at_the_quantile_of_fc_train_call_requests(trained: tuple[OffTopicGate, Path]) -> None:
    gate, directory = trained
    dismissal = gate.config.metrics["dismissal"]
    # Every call request of the data (both splits, ASCII only), not the gate's sample of them.
    assert dismissal["call_requests"] > gate.config.metrics["validation"]["call_requests"]
    assert dismissal["call_dismissed"] <= gate.config.max_false_dismissals + 1e-9
    assert -1.0 < gate.config.dismiss_threshold <= gate.config.cosine_threshold
    assert OffTopicGate.load(directory).config.dismiss_threshold == gate.config.dismiss_threshold


def test_an_english_request_far_from_every_tool_is_refused_without_the_large_model(embedder: MiniLMEmbedder) -> None:
    from hyfunc.routing.routed import RoutedMethod, Routing
    from tests.odia_fixtures import length_router

    cascade, tools = tiny_cascade(), parse_tools(TOOLS)
    cascade.gate = _gate(2.0, -1.0, embedder, dismiss=2.0)  # every cosine is below both; the head never agrees
    answer = cascade.answer(JOKE, tools)
    assert answer.calls == [] and answer.details == {"refused_by": "off_topic_gate", "dismissed": True}
    assert set(answer.timings) == {"gate"} and answer.input_tokens == 0  # no large-model pass
    # MiniLM reads English only: a request in another language is merely suspected, and the head disagrees.
    spanish = cascade.answer([{"role": "user", "content": "Cuéntame un chiste sobre gatos, por favor."}], tools)
    assert "dismissed" not in spanish.details and "large_prefill" in spanish.timings
    assert cascade.gate.screen(JOKE[0]["content"], []) == "clear"  # nothing offered: nothing to gate
    # Routed, the request goes to the cascade, which dismisses it.
    routed = RoutedMethod(cascade, Routing(router=length_router(threshold=-1e9), small=cascade, version="v"))
    assert routed.answer(JOKE, tools).details["dismissed"] is True


def test_the_gate_reads_a_follow_ups_new_message_not_the_transcript(embedder: MiniLMEmbedder) -> None:
    from hyfunc.formats.messages import conversation_text

    cascade, tools = tiny_cascade(), parse_tools(TOOLS)
    follow_up = [*WEATHER_ANSWERED, JOKE[0]]
    cascade.gate = _gate(-1.0, -1.0, embedder)
    transcript = cascade.gate.best_cosine(conversation_text(follow_up), tools)
    alone = cascade.gate.best_cosine(JOKE[0]["content"], tools)
    assert alone < transcript  # the transcript carries the weather request
    cascade.gate = _gate(-1.0, -1.0, embedder, dismiss=(alone + transcript) / 2)
    assert cascade.answer(follow_up, tools).details == {"refused_by": "off_topic_gate", "dismissed": True}
    reading_the_transcript = cascade.variant(CascadeOptions(follow_up_alone=False), "transcript")
    assert "dismissed" not in reading_the_transcript.answer(follow_up, tools).details


def test_the_gates_head_confirms_a_follow_up_on_the_new_messages_pass(embedder: MiniLMEmbedder) -> None:
    from hyfunc.formats.messages import follow_up_alone

    cascade, tools = tiny_cascade(), parse_tools(TOOLS)
    follow_up = [*WEATHER_ANSWERED, {"role": "user", "content": "And in Bergen?"}]
    torch.manual_seed(0)  # a head that reads the two passes differently; MiniLM suspects everything
    cascade.gate = OffTopicGate(torch.randn(LARGE_HIDDEN), torch.zeros(()), torch.zeros(LARGE_HIDDEN), torch.ones(LARGE_HIDDEN),
                                OffTopicConfig(cosine_threshold=2.0, head_threshold=0.0, dismiss_threshold=-1.0), embedder)
    with torch.no_grad():
        conversation, alone = (float(cascade.gate.head_logits(cascade.encoder.encode(m, tools).soft_token)[0])
                               for m in (follow_up, follow_up_alone(follow_up)))
    assert conversation != alone
    cascade.gate.config.head_threshold = (conversation + alone) / 2  # confirmed below it

    def refused(method) -> bool:
        return method.answer(follow_up, tools).details.get("refused_by") == "off_topic_gate"

    assert refused(cascade) is (alone < conversation)
    assert refused(cascade.variant(CascadeOptions(gate_confirms_alone=False), "conversation")) is (conversation < alone)


def test_router_sends_suspected_small_talk_to_the_cascade(embedder: MiniLMEmbedder) -> None:
    from hyfunc.routing.routed import RoutedMethod, Routing
    from tests.odia_fixtures import length_router

    cascade = tiny_cascade()
    routed = RoutedMethod(cascade, Routing(router=length_router(threshold=-1e9), small=cascade, version="v"))
    tools = parse_tools(TOOLS)
    assert routed.choose(JOKE, tools)[0] == "small"  # this router sends everything to the small path
    cascade.gate = _gate(2.0, 1.0, embedder)
    assert routed.choose(JOKE, tools) == ("cascade", None)
    assert routed.answer(JOKE, tools).details["refused_by"] == "off_topic_gate"


class CountingEmbedder:
    """MiniLM, counting the texts it embeds."""

    def __init__(self, inner: MiniLMEmbedder):
        self.inner, self.name, self.texts = inner, inner.name, 0

    def embed(self, texts):
        self.texts += len(texts)
        return self.inner.embed(texts)


def test_tool_vectors_are_embedded_once_when_gate_router_and_selectors_share_minilm(embedder: MiniLMEmbedder) -> None:
    from hyfunc.cascade.selector import ToolSelector, identity_selector
    from hyfunc.routing.routed import RoutedMethod, Routing, SharedEmbedder
    from tests.odia_fixtures import length_router

    tools = parse_tools(TOOLS)
    own = CountingEmbedder(embedder)
    cascade = tiny_cascade()
    cascade.gate = _gate(-2.0, -1.0, own)
    cascade.gate.suspects("what is the weather in Paris?", tools)
    assert own.texts == 1 + len(tools)
    shared_inner = CountingEmbedder(embedder)
    shared = SharedEmbedder(shared_inner)
    RoutedMethod(cascade, Routing(router=length_router(threshold=-1e9), small=cascade, version="v"), shared)
    cascade.gate.suspects("what is the weather in Rome?", tools)
    selectors = [ToolSelector(identity_selector(), shared) for _ in range(2)]  # e.g. the champion's and a candidate's
    for selector in selectors:
        selector.select("what is the weather in Rome?", tools)
    assert shared_inner.texts == 1  # the request once; the tools were embedded before sharing


def test_gate_rates_count_each_detector(embedder: MiniLMEmbedder) -> None:
    from hyfunc.cascade.off_topic import GateData

    gate = _gate(0.5, 0.5, embedder)
    gate.weight = torch.zeros(LARGE_HIDDEN)
    data = GateData(torch.tensor([0.9, 0.1, 0.1, 0.9]), torch.zeros(4, LARGE_HIDDEN), torch.tensor([1.0, 1.0, 0.0, 0.0]))
    rates = gate_rates(gate, data)  # the head's logit is 0 < 0.5 everywhere: only MiniLM tells them apart
    assert rates["call_refused_by_head"] == 1.0 and rates["call_refused_by_minilm"] == 0.5
    assert rates["call_refused_by_gate"] == 0.5 and rates["off_topic_refused_by_gate"] == 0.5


def test_refusal_benchmark_reports_both_sides(tmp_path: Path, embedder: MiniLMEmbedder) -> None:
    from hyfunc.eval.refusal import held_out_off_topic, refusal_sets, run_refusal_benchmark, write_refusal_report

    sets = refusal_sets([str(fc_subset(tmp_path / "data", 300))], calls=3, library_requests=3)
    for name in ("off-topic, demo tools", "off-topic, fc-train tools"):
        sets["sets"][name] = sets["sets"][name][:4]
    cascade = tiny_cascade()
    cascade.gate = _gate(2.0, 1.0, embedder)  # refuses everything: the bench must show it
    methods = {"with gate": cascade, "without gate": cascade.variant(CascadeOptions(off_topic_gate=False), "no-gate")}
    result = run_refusal_benchmark(methods, sets)
    for name, part in result["sets"].items():
        assert part["summary"]["with gate"]["refused"] == 1.0, name
        assert part["summary"]["without gate"]["refused"] == 0.0, name  # this tiny retriever never refuses
    assert result["sets"]["fc-train calls"]["summary"]["with gate"]["exact"] == 0.0
    assert cascade.library_state() is None  # the library set leaves no fixed library behind
    paths = write_refusal_report(result, tmp_path / "out")
    assert "| fixed library | 3 |" in paths["md"].read_text() and paths["png"].stat().st_size > 0
    assert len(held_out_off_topic()) == 60
