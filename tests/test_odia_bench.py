"""`hyfunc bench odia` on tiny random models (fast settings): the stream is served and logged,
cycles run, the promoted champion serves the next phase and is measured on held-out requests
against the cascade and the direct large model.

The data are in fc-train's format: "is the service up?" requests offered only `ping` (the tiny
cascade calls ping(), and so does any small path that writes a call: simple), and weather
requests offered three tools, whose required enum `detail` the cascade's large model chooses and
the small path's small model chooses on its own: two random models, which pick different members
(not simple). The free strings are no such source: both paths write them with the same tiny small
model, and on some CPUs it wrote the same text for every request."""
from __future__ import annotations

import json
import random
import weakref
from pathlib import Path

import pytest

from hyfunc.cli import main
from hyfunc.eval.odia_bench import OdiaBenchConfig, run_odia_bench, write_odia_report
from hyfunc.methods.cascade import HyFuncMethod
from hyfunc.methods.direct import DirectMethod
from hyfunc.routing.cycle import CycleConfig
from hyfunc.routing.distil import DistilConfig
from hyfunc.routing.stores import open_store
from hyfunc.routing.versions import GateConfig
from tests.odia_fixtures import tiny_artifact, permissive_selector
from tests.test_serve_sdk import TOOLS


def synthetic_data(directory: Path, n: int = 300) -> Path:
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    weather = {"name": "get_weather", "description": "Current weather of a city", "parameters": {
        "type": "object", "required": ["city", "detail"], "properties": {
            "city": {"type": "string"},
            "detail": {"type": "string", "enum": ["brief", "hourly", "daily", "weekly", "alerts", "radar", "uv", "pollen"]}}}}
    others = [t["function"] for t in TOOLS if t["function"]["name"] != "get_weather"]
    lines = []
    for i in range(n):
        if i % 2 == 0:
            tools = [t["function"] for t in TOOLS if t["function"]["name"] == "ping"]
            record = {"query": f"Is the service up right now? Check number {i}.", "tools": tools,
                      "answers": [{"name": "ping", "arguments": {}}]}
        else:
            city = "".join(rng.choice("qxzjkvw") for _ in range(7)).capitalize()
            record = {"query": f"What is the weather like in {city} today?", "tools": [weather, *others],
                      "answers": [{"name": "get_weather", "arguments": {"city": city, "detail": "brief"}}]}
        lines.append(json.dumps({"id": f"s{i}", "source": "synthetic", **record}))
    (directory / "synthetic.jsonl").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("bench")
    permissive_selector(root / "selector")
    return {"root": root, "data": synthetic_data(root / "data"), "artifact": tiny_artifact(root / "cascade"),
            "selector": root / "selector"}


def test_bench_odia_serves_learns_and_measures(parts: dict) -> None:
    cascade = HyFuncMethod.load(parts["artifact"])
    direct = {"direct:tiny": DirectMethod(cascade.large, max_new_tokens=8)}
    direct_alive = weakref.ref(direct["direct:tiny"])
    # The tiny cascade answers in milliseconds, less than MiniLM's routing: latency may grow here.
    cycle = CycleConfig(target=0.9, min_requests=20, selector=str(parts["selector"]),
                        gate=GateConfig(latency_tolerance=1000.0), distil=DistilConfig(lora_rank=4, max_items=8))
    config = OdiaBenchConfig(stream=60, cycle_every=30, held_out=10, explore=0.2, cycle=cycle)
    out = parts["root"] / "report"
    result = run_odia_bench(cascade, parts["artifact"], direct, [str(parts["data"])], out, config)
    assert result["stream"] == 60 and result["held_out"] == 10 and result["scenario"] == "own-tools"
    assert direct == {} and direct_alive() is None  # measured in the first stretch, then freed
    assert result["cascade"]["agreement"] == 1.0 and result["direct"]["direct:tiny"]["n"] == 10
    first, second = result["cycles"]
    assert (first["served"], second["served"]) == (30, 60) and first["phase_small_share"] == 0.0
    assert first["status"] == "promoted", first
    routed = first["routed"]
    # The promoted router sends ping requests (half the held-out slice at most) to the small path.
    assert 0.0 < routed["share"] <= 0.6 and routed["agreement"] >= 0.5 and routed["latency"]["mean"] > 0
    assert second["phase_small_share"] > 0.0  # the champion served the second phase
    # After a promotion the cascade is measured again beside the routed system, request by request.
    assert first["cascade"]["n"] == 10 and len(first["cascade"]["latencies"]) == len(routed["latencies"]) == 10
    assert routed["vs_cascade"]["median_of_ratios"] > 0 and result["direct"]["direct:tiny"]["vs_cascade"]["mean"] > 0
    with open_store(out / "traffic.sqlite") as store:
        stats = store.stats()
    assert stats.total == 60 and stats.by_path.get("small", 0) == round(30 * second["phase_small_share"])

    paths = write_odia_report(result, out)
    md = paths["md"].read_text()
    assert "| cascade alone |" in md and "| direct:tiny |" in md and md.count("| routed |") == 2
    assert md.count("| cascade, same stretch |") == sum("cascade" in p for p in result["cycles"]) >= 1
    assert paths["png"].stat().st_size > 10_000


def test_bench_odia_command_line_is_wired(parts: dict, capsys: pytest.CaptureFixture) -> None:
    """The CLI builds the same run: too short a stream for one cycle is a one-line error."""
    args = ["bench", "odia", "--data", str(parts["data"]), "--artifact", str(parts["artifact"]), "--stream", "4",
            "--cycle-every", "10", "--out", str(parts["root"] / "cli")]
    assert main(args) == 2
    assert "too few for this configuration" in capsys.readouterr().err


def test_bench_odia_library_scenario_prompts_the_direct_model_with_the_selectors_tools(parts: dict) -> None:
    """With one fixed library the direct model answers over the tools the small path's selector
    keeps (a 4,000-tool library would not fit its prompt)."""
    from hyfunc.formats.schema import parse_tools

    cascade = HyFuncMethod.load(parts["artifact"])
    direct = {"direct:tiny": DirectMethod(cascade.large, max_new_tokens=8)}
    cycle = CycleConfig(target=0.9, min_requests=1000, selector=str(parts["selector"]))  # no cycle runs
    config = OdiaBenchConfig(stream=20, cycle_every=20, held_out=6, cycle=cycle)
    library = parse_tools(TOOLS)
    result = run_odia_bench(cascade, parts["artifact"], direct, [str(parts["data"])], parts["root"] / "lib", config, library)
    assert result["scenario"] == "library" and result["library_tools"] == len(library)
    assert list(result["direct"]) == ["direct:tiny over the selector's tools"]
    assert result["cycles"][0]["status"] == "skipped" and "cascade" not in result["cycles"][0]
