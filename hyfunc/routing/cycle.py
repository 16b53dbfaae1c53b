"""One gated update (`hyfunc odia cycle`): distil -> mine -> train the router -> replay -> gate.

The window is the large path's logged traffic (cascade / large / direct answers, without error),
split by time: the older part trains, the newest `holdout` share is held out for the gate.

1. distil: a LoRA adapter of the small model on the teacher's answers of the training window,
   plus a replay sample of fc-train (distil.py), warm started from the champion's adapter (or,
   before the first version, the cascade's). With `distil_on="agreed"` only the answers the
   current small path already reproduces (mined first), leaving out teacher mistakes such as
   optional values the request never stated. Measured on 90 fc-train validation requests
   (non-AMX CPU, llama.cpp): the cascade's own small path 50 exact; distilled on all answers 43;
   on agreed answers only 45; on 125 answers (all) 38, and 45 agreeing with the cascade against 50
   undistilled. Hence `labelled`: the gate's check against gold; and `distil_on="none"`: keep the
   current small model and retrain only the router (the same window routed 46 of those 90 requests,
   48 exact against the cascade's 47, reports/cpu-llamacpp/odia-distil-scale/);
2. mine: the candidate small path (that adapter + the champion's tool selector) on the training
   window, labelled simple where its calls equal the teacher's (mining.py; kept in memory);
3. router: a logistic router on those labels, its threshold calibrated for `target` agreement
   (router.py); with `small_first` it reads the small path's answer (its lowest value-token
   probability, its number of calls) and the request's scalars, not its embedding: served, every
   request then runs the small path first and only the doubtful ones go on to the cascade;
4. replay the held-out window through the candidate and through the champion, measured in the
   same run (evaluate.py): agreement with the large path, share on the small path, mean latency,
   and accuracy where gold is known (feedback `good` marks a logged answer as gold); with
   `labelled`, also the small path alone against gold on that many fc-train validation requests;
5. gate (versions.py): promote only if the candidate does not regress against the champion
   (before any version: against serving everything through the cascade, with agreement at
   least `target` - tolerance). Every candidate becomes an immutable version, promoted or not,
   its manifest saying why; a promoted candidate's labels replace the store's.
"""
from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from hyfunc.cascade.manifest import MANIFEST
from hyfunc.cascade.selector import default_selector_dir
from hyfunc.models.minilm import MINILM_NAME, Embedder
from hyfunc.routing.distil import (
    DistilConfig,
    distil,
    labelled_examples,
    replay_examples,
    teacher_examples,
)
from hyfunc.routing.evaluate import replay, replay_router, small_path_accuracy
from hyfunc.routing.mining import method_small_path, mine
from hyfunc.routing.routed import (
    CASCADE_ADAPTER,
    SMALL_MANIFEST,
    Routing,
    SharedEmbedder,
    adapter_sha256,
    artifact_adapter,
    load_small,
    load_version,
    open_small,
    small_description,
)
from hyfunc.routing.router import RouterError, RoutingExample, train_router
from hyfunc.routing.store import LARGE_PATHS, Label, Query, TrafficStore
from hyfunc.routing.versions import GateConfig, Metrics, Verdict, VersionStore, gate


DISTIL_ON = ("all", "agreed", "none")  # which teacher answers a cycle distils


@dataclass
class CycleConfig:
    target: float = 0.99  # the router's agreement with the large path on held-out traffic
    # The router reads the small path's answer (small-first serving). Without the embedding: with
    # a cycle's few hundred labels its 384 dimensions drown the confidence (reports/odia-small-first).
    small_first: bool = False
    holdout: float = 0.2  # newest share of the window held out for the gate's replay
    min_requests: int = 100  # fewer large-path requests in the window: no cycle
    since: float | None = None  # the window's start (Unix s); None: all logged traffic
    replay_data: list[str] = field(default_factory=list)  # fc-train, for the distillation's replay sample
    distil_on: str = "all"  # "all" teacher answers, those the current small path "agreed" with, or "none"
    labelled: int = 0  # fc-train validation requests (from replay_data) scoring the small path against gold
    selector: str | None = None  # the first version's tool selector (default: the shipped one)
    engine: str = "auto"  # what the small path is measured on (as it will be served)
    device: str | None = None
    gate: GateConfig = field(default_factory=lambda: GateConfig(latency_tolerance=0.05))
    distil: DistilConfig = field(default_factory=DistilConfig)


@dataclass
class CycleReport:
    status: str  # promoted | refused | skipped
    reasons: list[str]
    version: str | None = None
    champion: str | None = None  # before this cycle
    candidate: dict | None = None  # Metrics
    baseline: dict | None = None  # the champion's (or the cascade's) Metrics on the same held-out traffic
    window: dict = field(default_factory=dict)
    distillation: dict = field(default_factory=dict)
    mining: dict = field(default_factory=dict)
    router: dict = field(default_factory=dict)
    seconds: float = 0.0


def _artifact_small(artifact: Path) -> tuple[str, Path | None]:
    manifest = json.loads((artifact / MANIFEST).read_text())
    return manifest["small_model"], artifact_adapter(artifact)


def _window(store: TrafficStore, since: float | None, holdout: float) -> tuple[list[float], float | None]:
    """Creation times of the window's large-path requests, and where the held-out part starts."""
    times = [s.request.created for s in store.iter_requests(Query(since=since, paths=LARGE_PATHS, without_error=True))]
    if not times:
        return times, None
    n_held = max(1, int(round(len(times) * holdout)))
    return times, times[-n_held]


def _gold(store: TrafficStore, query: Query, extra: Mapping[str, list[dict]] | None) -> dict[str, list[dict]]:
    """Logged answers marked good are gold; `extra` (e.g. a benchmark's known answers) wins."""
    gold = {s.request.request_id: s.request.calls for s in store.iter_requests(query) if s.feedback == "good"}
    return {**gold, **(extra or {})}


def run_cycle(store: TrafficStore, versions: VersionStore, artifact: str | Path, config: CycleConfig | None = None,
              embedder: Embedder | None = None, gold: Mapping[str, list[dict]] | None = None) -> CycleReport:
    config = config or CycleConfig()
    if config.distil_on not in DISTIL_ON:
        raise ValueError(f"distil_on must be one of {', '.join(DISTIL_ON)}, got {config.distil_on!r}")
    if config.labelled and not config.replay_data:
        raise ValueError("scoring the small path on labelled requests needs fc-train (replay_data)")
    started = time.perf_counter()
    artifact = Path(artifact)
    embedder = embedder if isinstance(embedder, SharedEmbedder) else SharedEmbedder(embedder)
    champion_id = versions.champion
    times, held_since = _window(store, config.since, config.holdout)
    report = CycleReport("skipped", [], champion=champion_id,
                         window={"since": config.since, "requests": len(times), "held_out_since": held_since})
    if len(times) < config.min_requests or held_since is None:
        report.reasons = [f"{len(times)} large-path requests in the window; a cycle needs {config.min_requests}"]
        return report
    # The last cycle's window, promoted or refused: the same traffic would give the same verdict.
    last = versions.list()[-1].get("window", {}) if versions.list() else {}
    if last.get("until") is not None and times[-1] <= last["until"]:
        report.reasons = ["no large-path traffic newer than the last cycle's"]
        return report
    train_query = Query(since=config.since, until=held_since, without_error=True)
    held_query = Query(since=held_since, without_error=True)
    report.window.update({"until": times[-1], "train": sum(t < held_since for t in times),
                          "held_out": sum(t >= held_since for t in times)})

    # What the candidate starts from: the champion's small path, or the cascade's small model.
    base_model, cascade_adapter = _artifact_small(artifact)
    warm = cascade_adapter
    champion: Routing | None = None
    if champion_id is not None:
        champion = load_version(versions.path(champion_id), embedder, config.engine, config.device, champion_id,
                                cascade_adapter)
        small_dir = versions.path(champion_id) / "small"
        description = json.loads((small_dir / SMALL_MANIFEST).read_text())
        base_model = description["base_model"]
        if description.get("adapter") != CASCADE_ADAPTER:
            warm = small_dir / description["adapter"] if description.get("adapter") else None
        selector_dir = small_dir / description["selector"]
    else:
        selector_dir = Path(config.selector) if config.selector else default_selector_dir()

    work = versions.scratch / f"cycle-{uuid.uuid4().hex[:8]}"
    try:
        candidate_dir = work / "small"
        candidate_dir.mkdir(parents=True)
        shutil.copytree(selector_dir, candidate_dir / "selector")
        from hyfunc.cascade.selector import ToolSelector

        selector = ToolSelector.load(candidate_dir / "selector", embedder)
        teacher = teacher_examples(store, train_query)
        if not teacher:
            report.reasons = ["no teacher answer with calls in the training window"]
            return report
        # The small path being served (or, before any version, the one the candidate starts from).
        current = None
        if config.distil_on == "agreed" or config.labelled:
            current = champion.small if champion is not None and champion.small is not None else open_small(
                base_model, warm, selector_dir, embedder, config.engine, config.device, "current")
        if config.distil_on == "agreed":
            agreed: list[Label] = []
            mine(store, method_small_path(current), small_path_name="current", query=train_query, relabel=True,
                 save=agreed.extend)
            simple = {label.request_id for label in agreed if label.simple}
            report.distillation["teacher_agreed"] = f"{sum(ex.id in simple for ex in teacher)} of {len(teacher)}"
            teacher = [ex for ex in teacher if ex.id in simple]
            if not teacher:
                report.reasons = ["the current small path reproduces no teacher answer of the training window"]
                return report
        adapter: str | None = None
        pinned = None
        if config.distil_on == "none":
            # The current small model as it is: only the router is retrained on this window's labels.
            # The cascade's own adapter is referred to, not copied (35 MB per version otherwise).
            if warm is not None and warm == cascade_adapter:
                adapter, pinned = CASCADE_ADAPTER, adapter_sha256(warm)
            elif warm is not None:
                shutil.copytree(warm, candidate_dir / "adapter")
                adapter = "adapter"
            report.distillation["skipped"] = "distil_on='none': the current small model, a new router"
        else:
            fc_replay = replay_examples(config.replay_data, int(config.distil.replay_fraction * len(teacher)) + 1,
                                        config.distil.seed)
            report.distillation.update(distil(base_model, warm, teacher, fc_replay, selector, work / "distil",
                                              config.distil))
            shutil.move(str(work / "distil" / "adapter"), str(candidate_dir / "adapter"))
            adapter = "adapter"
        (candidate_dir / SMALL_MANIFEST).write_text(json.dumps(small_description(base_model, adapter, pinned)))
        small = load_small(candidate_dir, embedder, config.engine, config.device, "candidate", cascade_adapter)

        labels: list[Label] = []
        mining = mine(store, method_small_path(small), small_path_name=f"candidate:{work.name}", embedder=embedder,
                      query=train_query, relabel=True, save=labels.extend)
        report.mining = {"labelled": mining.labelled, "simple": mining.simple, "simple_share": mining.simple_share,
                         "small_failures": mining.small_failures, "seconds": mining.seconds}
        created = {s.request.request_id: s.request.created for s in store.iter_requests(train_query)}
        examples = [RoutingExample(l.features, None if config.small_first else l.embedding, l.simple,
                                   created[l.request_id]) for l in labels]
        try:
            router = train_router(examples, target=config.target, use_small_answer=config.small_first,
                                  embedder=embedder, embedder_name=None if config.small_first else MINILM_NAME,
                                  window={"since": config.since, "until": held_since})
        except RouterError as err:
            report.status, report.reasons = "refused", [f"no router: {err}"]
            return report
        report.router = {"threshold": router.threshold, "calibration": router.manifest["calibration"]}

        gold_map = _gold(store, held_query, gold)
        candidate = replay_router(store, router, method_small_path(small), held_query, gold_map)
        if champion is not None and champion.router is not None and champion.small is not None:
            baseline = replay_router(store, champion.router, method_small_path(champion.small), held_query, gold_map)
        else:
            cascade_only = replay(store, lambda m, t, _: "large", method_small_path(small), held_query, gold_map)
            # The first version's bar: the target agreement, and not slower than the cascade alone.
            baseline = Metrics(config.target, 0.0, cascade_only.mean_latency, cascade_only.accuracy)
        if config.labelled:
            labelled = labelled_examples(config.replay_data, config.labelled, config.distil.seed)
            candidate = replace(candidate, small_accuracy=small_path_accuracy(method_small_path(small), labelled))
            baseline = replace(baseline, small_accuracy=small_path_accuracy(method_small_path(current), labelled))
        verdict: Verdict = gate(baseline, candidate, config.gate)
        report.candidate, report.baseline = asdict(candidate), asdict(baseline)
        report.status, report.reasons = ("promoted" if verdict.promote else "refused"), verdict.reasons

        def build(directory: Path) -> None:
            shutil.copytree(candidate_dir, directory / "small")
            router.save(directory / "router")
            (directory / "cycle.json").write_text(json.dumps(asdict(report), indent=2, default=str))

        report.version = versions.create(build, metrics=candidate, parents=[champion_id] if champion_id else [],
                                         window={"since": config.since, "until": times[-1], "held_out_since": held_since},
                                         note="; ".join(verdict.reasons))
        if verdict.promote:
            versions.promote(report.version)
            store.save_labels(labels)  # the store's labels now describe the small path being served
        return report
    finally:
        report.seconds = time.perf_counter() - started
        shutil.rmtree(work, ignore_errors=True)


def describe(report: CycleReport) -> str:
    """One paragraph for the command line."""
    head = {"promoted": f"promoted {report.version}", "refused": f"refused {report.version or '(no candidate)'}",
            "skipped": "skipped"}[report.status]
    lines = [f"cycle: {head} ({report.seconds:.0f} s): " + "; ".join(report.reasons)]
    for name, m in (("candidate", report.candidate), ("baseline", report.baseline)):
        if m:
            accuracy = "-" if m.get("accuracy") is None else f"{m['accuracy']:.2%}"
            labelled = "" if m.get("small_accuracy") is None else f"  small path on the labelled set {m['small_accuracy']:.2%}"
            lines.append(f"  {name:9} share {m['share']:6.1%}  agreement {m['agreement']:7.2%}  accuracy {accuracy:>7}  "
                         f"latency {m['mean_latency'] * 1e3:8.1f} ms{labelled}")
    return "\n".join(lines)


def cycle_json(report: CycleReport) -> dict[str, Any]:
    return asdict(report)
