"""The gated cycle end to end on tiny random models (fast settings): distillation on logged
teacher answers, mining with the candidate, a router, replay of held-out traffic, promotion;
a deliberately broken candidate refused; the promoted version served by the routed method.

The traffic has two kinds of request: "is the service up?" offered only `ping` (the teacher calls
ping(): any small model that writes one call agrees) and weather requests whose city is a random
string (a tiny random model cannot write it: it disagrees). So the labels, the router's boundary
and the gate's verdicts follow from the traffic, not from chance."""
from __future__ import annotations

import json
import random
import shutil

import pytest
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from hyfunc.cli import main
from hyfunc.formats.schema import parse_tools
from hyfunc.methods.cascade import HyFuncMethod
from hyfunc.routing.cycle import CycleConfig, run_cycle
from hyfunc.routing.distil import DistilConfig
from hyfunc.models.minilm import MINILM_NAME
from hyfunc.routing.record import ServedRequest
from hyfunc.routing.routed import CASCADE_ADAPTER, SMALL_MANIFEST, RoutedMethod, SharedEmbedder, adapter_sha256, load_version
from hyfunc.routing.store import encode
from hyfunc.routing.stores import open_store
from hyfunc.routing.versions import Versions
from tests.odia_fixtures import tiny_artifact, permissive_selector
from tests.test_serve_sdk import TOOLS

T0 = 1_700_000_000.0
PING = [t for t in TOOLS if t["function"]["name"] == "ping"]
TIMINGS = {"large_prefill": 4.0, "retrieve": 0.01, "small_prefill": 0.3, "small_decode": 0.7}  # the cascade's cost (5 s)


def traffic(start: int, n: int) -> list[ServedRequest]:
    rng = random.Random(start)
    out = []
    for i in range(start, start + n):
        if i % 2 == 0:
            text, tools, calls = f"Is the service up right now? Check number {i}.", PING, [{"name": "ping", "arguments": {}}]
        else:
            city = "".join(rng.choice("qxzjkvw") for _ in range(7)).capitalize()
            text, tools = f"What is the weather like in {city} today?", TOOLS
            calls = [{"name": "get_weather", "arguments": {"city": city}}]
        out.append(ServedRequest([{"role": "user", "content": text}], tools, calls, path="cascade",
                                 timings=dict(TIMINGS), request_id=f"r{i}", created=T0 + i))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("cycle")
    permissive_selector(root / "selector")
    store = root / "traffic.sqlite"
    with open_store(store) as opened:
        opened.write([encode(r) for r in traffic(0, 60)])
        for i in range(48, 60, 3):
            opened.set_feedback(f"r{i}", "good", at=T0)  # a labelled holdout: accuracy is scored
    return {"root": root, "store": store, "artifact": tiny_artifact(root / "cascade"), "selector": root / "selector",
            "versions": root / "odia"}


def test_cycles_promote_refuse_and_serve(setup: dict, capsys: pytest.CaptureFixture) -> None:
    args = ["odia", "cycle", "--store", str(setup["store"]), "--artifact", str(setup["artifact"]),
            "--out", str(setup["versions"]), "--selector", str(setup["selector"]), "--min-requests", "40",
            "--lora-rank", "4", "--target", "0.95", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["status"] == "promoted", first
    versions = Versions(setup["versions"])
    v1 = first["version"]
    assert versions.champion == v1 and first["champion"] is None
    assert first["window"] == {**first["window"], "requests": 60, "train": 48, "held_out": 12}
    assert first["distillation"]["teacher_items"] == 48 and first["distillation"]["warm_start"] is None
    # Labels follow the traffic: every ping request agrees, no random city is written.
    assert first["mining"]["labelled"] == 48 and first["mining"]["simple"] == 24
    candidate = first["candidate"]
    # Only ping requests are routed (half of the held-out traffic at most), and they all agree.
    assert 0.25 <= candidate["share"] <= 0.5 and candidate["agreement"] == 1.0 and candidate["accuracy"] == 1.0, first
    # The first version's bar: serving everything through the cascade (its logged cost), at the target agreement.
    assert first["baseline"]["mean_latency"] == pytest.approx(sum(TIMINGS.values()), abs=0.01)
    assert first["baseline"]["agreement"] == 0.95 and candidate["mean_latency"] < first["baseline"]["mean_latency"]
    manifest = versions.manifest(v1)
    assert {"router", "small", "cycle.json"} <= {p.name for p in versions.path(v1).iterdir()}
    assert manifest["window"]["until"] == T0 + 59 and manifest["metrics"] == candidate
    with open_store(setup["store"]) as store:
        labels = {s.request.request_id: l for s, l in store.iter_labels()}
    assert len(labels) == 48 and labels["r0"].simple and not labels["r1"].simple
    assert labels["r0"].embedder == MINILM_NAME

    # Nothing new logged: nothing to learn.
    assert main(args) == 0 and json.loads(capsys.readouterr().out)["status"] == "skipped"

    # New traffic, and a deliberately broken candidate: a router that sends everything to the
    # small path (target agreement 1 %), which cannot write the cities. Refused; v1 stays.
    with open_store(setup["store"]) as store:
        store.write([encode(r) for r in traffic(60, 30)])
        config = CycleConfig(target=0.01, min_requests=40, selector=str(setup["selector"]),
                             distil=DistilConfig(lora_rank=4, max_items=16))
        broken = run_cycle(store, versions, setup["artifact"], config)
    assert broken.status == "refused" and versions.champion == v1, broken
    assert broken.candidate["share"] >= 0.9 and any("agreement" in r for r in broken.reasons)
    assert broken.distillation["warm_start"].endswith("adapter")  # continued from the champion's adapter
    assert versions.manifest(broken.version)["parents"] == [v1] and len(versions.list()) == 2
    with open_store(setup["store"]) as store:  # the same traffic again: not re-judged
        again = run_cycle(store, versions, setup["artifact"], config)
    assert again.status == "skipped" and "newer than the last cycle" in again.reasons[0]

    # The champion, served: ping requests on the small path, weather requests on the cascade.
    routed = RoutedMethod.load(HyFuncMethod.load(setup["artifact"]), setup["versions"])
    assert routed.routing.version == v1
    ping = routed.answer([{"role": "user", "content": "Is the service up right now? Check number 100."}], parse_tools(PING))
    weather = routed.answer([{"role": "user", "content": "What is the weather like in Qzxvkj today?"}],
                            parse_tools(TOOLS))
    assert ping.details["path"] == "small" and [c.name for c in ping.calls] == ["ping"]
    assert weather.details["path"] == "cascade"


def test_small_first_cycle_routes_on_the_small_paths_answer(setup: dict, tmp_path) -> None:
    """A router that reads the small path's answer: the tiny model writes ping() with nothing left
    to generate (confidence 1) and a random city only with low probability, so the confidence
    alone separates the traffic; served, both requests run the small path first."""
    store_path = tmp_path / "traffic.sqlite"
    with open_store(store_path) as store:
        store.write([encode(r) for r in traffic(0, 60)])
        config = CycleConfig(target=0.95, small_first=True, min_requests=40, selector=str(setup["selector"]),
                             distil=DistilConfig(lora_rank=4, max_items=16))
        report = run_cycle(store, Versions(tmp_path / "odia"), setup["artifact"], config)
    assert report.status == "promoted", report
    router = json.loads((tmp_path / "odia" / "versions" / report.version / "router" / "router.json").read_text())
    assert "small_confidence" in router["scalars"] and router["embedder"] == ""
    assert 0.25 <= report.candidate["share"] <= 0.5 and report.candidate["agreement"] == 1.0, report
    # Every held-out request ran the small path: an escalated one costs it on top of the cascade's.
    assert report.candidate["mean_latency"] > 0.5 * sum(TIMINGS.values())

    routed = RoutedMethod.load(HyFuncMethod.load(setup["artifact"]), tmp_path / "odia")
    assert routed.routing.router.needs_small_answer
    ping = routed.answer([{"role": "user", "content": "Is the service up right now? Check number 100."}], parse_tools(PING))
    weather = routed.answer([{"role": "user", "content": "What is the weather like in Qzxvkj today?"}],
                            parse_tools(TOOLS))
    assert ping.details["path"] == "small" and [c.name for c in ping.calls] == ["ping"]
    assert weather.details["path"] == "cascade" and "tried_small_decode" in weather.timings


def fc_train_file(path, n: int = 60) -> str:
    """fc-train records like the stream's: ping requests (a tiny model agrees with gold) and
    weather requests with a random city (it cannot write it). Some fall in the validation split."""
    rng = random.Random(1)
    with open(path, "w") as f:
        for i in range(n):
            if i % 2 == 0:
                record = {"id": f"fc-{i}", "query": f"Is the service up? Check {i}.", "answers": [{"name": "ping", "arguments": {}}],
                          "tools": [{"name": "ping", "description": "Check that the service is up"}]}
            else:
                city = "".join(rng.choice("qxzjkvw") for _ in range(7)).capitalize()
                record = {"id": f"fc-{i}", "query": f"What is the weather like in {city} today?",
                          "tools": [t["function"] for t in TOOLS], "answers": [{"name": "get_weather", "arguments": {"city": city}}]}
            f.write(json.dumps(record) + "\n")
    return str(path)


def test_agreed_distillation_and_the_small_paths_labelled_accuracy(setup: dict, tmp_path) -> None:
    """`distil_on="agreed"`: only the teacher answers the current small path reproduces (the ping
    requests) are distilled; `labelled`: candidate and baseline small paths are scored against gold
    on fc-train validation requests, and the scores are the ones a direct count gives."""
    from hyfunc.routing.distil import labelled_examples

    data = fc_train_file(tmp_path / "fc.jsonl")
    labelled = labelled_examples([data], 8)
    assert labelled and all(ex.id.startswith("fc-") for ex in labelled)
    pings = sum(ex.answers[0].name == "ping" for ex in labelled) / len(labelled)
    store_path = tmp_path / "traffic.sqlite"
    with open_store(store_path) as store:
        store.write([encode(r) for r in traffic(0, 60)])
        config = CycleConfig(target=0.95, small_first=True, min_requests=40, selector=str(setup["selector"]),
                             replay_data=[data], distil_on="agreed", labelled=8,
                             distil=DistilConfig(lora_rank=4, replay_fraction=0.0))
        report = run_cycle(store, Versions(tmp_path / "odia"), setup["artifact"], config)
    assert report.distillation["teacher_agreed"] == "24 of 48" and report.distillation["teacher_items"] == 24, report
    assert report.candidate["small_accuracy"] == pytest.approx(pings) == report.baseline["small_accuracy"], report
    assert report.status == "promoted", report
    with open_store(store_path) as store, pytest.raises(ValueError, match="replay_data"):
        run_cycle(store, Versions(tmp_path / "odia"), setup["artifact"], CycleConfig(labelled=8))


def test_a_cycle_without_distillation_keeps_the_small_model_and_retrains_the_router(setup: dict, tmp_path) -> None:
    """`distil_on="none"`: after a distilled champion, the next candidate's adapter is the
    champion's, byte for byte; mining, the router and the gate run as usual on the new window."""
    store_path = tmp_path / "traffic.sqlite"
    versions = Versions(tmp_path / "odia")
    base = dict(target=0.95, small_first=True, min_requests=40, selector=str(setup["selector"]))
    with open_store(store_path) as store:
        store.write([encode(r) for r in traffic(0, 60)])
        first = run_cycle(store, versions, setup["artifact"], CycleConfig(**base, distil=DistilConfig(lora_rank=4, max_items=16)))
        assert first.status == "promoted" and first.distillation["teacher_items"] == 16, first
        store.write([encode(r) for r in traffic(60, 60)])
        second = run_cycle(store, versions, setup["artifact"], CycleConfig(**base, distil_on="none"))
    assert "skipped" in second.distillation and "teacher_items" not in second.distillation, second
    assert second.version and second.mining["labelled"] == second.window["train"] == 96, second
    champion = versions.path(first.version) / "small" / "adapter"
    kept = versions.path(second.version) / "small" / "adapter"
    files = sorted(p.relative_to(champion) for p in champion.rglob("*") if p.is_file())
    assert files and sorted(p.relative_to(kept) for p in kept.rglob("*") if p.is_file()) == files
    assert all((kept / f).read_bytes() == (champion / f).read_bytes() for f in files)
    with open_store(store_path) as store, pytest.raises(ValueError, match="distil_on"):
        run_cycle(store, versions, setup["artifact"], CycleConfig(distil_on="some"))


def test_a_cycle_without_distillation_names_the_cascades_adapter_instead_of_copying_it(setup: dict, tmp_path) -> None:
    """`distil_on="none"` on the cascade's own small model: the version pins the cascade's adapter by
    its sha256 (no 35 MB copy); it loads with that cascade, and with another adapter or none it is
    refused with the reason."""
    artifact = tmp_path / "cascade"
    shutil.copytree(setup["artifact"], artifact)
    small_model = json.loads((artifact / "manifest.json").read_text())["small_model"]
    torch_model = AutoModelForCausalLM.from_pretrained(small_model)
    get_peft_model(torch_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(artifact / "adapter")
    versions = Versions(tmp_path / "odia")
    with open_store(tmp_path / "traffic.sqlite") as store:
        store.write([encode(r) for r in traffic(0, 60)])
        report = run_cycle(store, versions, artifact, CycleConfig(target=0.95, small_first=True, min_requests=40,
                                                                  selector=str(setup["selector"]), distil_on="none"))
    assert report.version, report
    small = versions.path(report.version) / "small"
    description = json.loads((small / SMALL_MANIFEST).read_text())
    assert description["adapter"] == CASCADE_ADAPTER and not (small / "adapter").exists(), description
    assert description["adapter_sha256"] == adapter_sha256(artifact / "adapter")
    assert report.mining["labelled"] == 48, report  # the candidate's small path ran with the cascade's adapter

    embedder = SharedEmbedder()
    routing = load_version(versions.path(report.version), embedder, cascade_adapter=artifact / "adapter")
    assert routing.small is not None and routing.router is not None
    with pytest.raises(FileNotFoundError, match="load it with that cascade"):
        load_version(versions.path(report.version), embedder)
    other = tmp_path / "other-adapter"
    shutil.copytree(artifact / "adapter", other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    with pytest.raises(ValueError, match="not .*other-adapter"):
        load_version(versions.path(report.version), embedder, cascade_adapter=other)
    # Served against the cascade it names (RoutedMethod finds the adapter through the cascade's artifact).
    routed = RoutedMethod.load(HyFuncMethod.load(artifact), versions.path(report.version))
    assert routed.routing.version == report.version and routed.routing.small is not None
    with pytest.raises(FileNotFoundError, match="load it with that cascade"):
        RoutedMethod.load(HyFuncMethod.load(setup["artifact"]), versions.path(report.version))
