"""Handlers of `hyfunc odia ...`: the traffic log from the command line (feedback, stats, retention and
forgetting, router training).

Every failure is one line on stderr and a non-zero exit code: 2 for bad input (unknown id, bad
URL, missing store), 3 when the database cannot be reached.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from dataclasses import asdict

from hyfunc.errors import InputError
from hyfunc.routing.store import (
    Retention,
    StoreError,
    StoreUnavailable,
    TrafficStore,
    UnknownRequest,
)
from hyfunc.routing.stores import open_store, parse_store_url


def _open_existing(url: str | None) -> TrafficStore:
    """Open a store that must already exist: reading or annotating an empty, just-created file
    would hide a wrong path."""
    kind, where = parse_store_url(url)
    if kind == "sqlite" and not where.exists():  # type: ignore[union-attr]
        raise StoreError(f"no traffic store at {where} (nothing logged yet, or a wrong --store)")
    return open_store(url)


def _run(body) -> int:
    try:
        return body()
    except StoreUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except StoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def cmd_feedback(args: argparse.Namespace) -> int:
    def body() -> int:
        with _open_existing(args.store) as store:
            store.set_feedback(args.request_id, args.verdict, at=time.time())
        print(f"{args.request_id}: {args.verdict}")
        return 0

    return _run(body)


def cmd_prune(args: argparse.Namespace) -> int:
    if args.keep_days is None and args.keep_rows is None:
        raise InputError("odia prune needs --keep-days DAYS and/or --keep-rows N")
    retention = Retention(args.keep_days, args.keep_rows)

    def body() -> int:
        with _open_existing(args.store) as store:
            deleted = store.prune(retention)
        print(f"deleted {deleted} requests from {store.url}")
        return 0

    return _run(body)


def cmd_forget(args: argparse.Namespace) -> int:
    def body() -> int:
        with _open_existing(args.store) as store:
            # All or nothing: a mistyped id among several must not leave the command half done.
            unknown = [request_id for request_id in dict.fromkeys(args.request_ids) if not _logged(store, request_id)]
            if unknown:
                raise UnknownRequest(f"no logged request has id {', '.join(map(repr, unknown))} in {store.url}; "
                                     "nothing deleted")
            deleted = store.delete_requests(args.request_ids)
        print(f"deleted {deleted} requests from {store.url}")
        return 0

    return _run(body)


def _logged(store: TrafficStore, request_id: str) -> bool:
    try:
        store.get(request_id)
    except UnknownRequest:
        return False
    return True


def _when(t: float | None) -> str:
    return "-" if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def cmd_stats(args: argparse.Namespace) -> int:
    def body() -> int:
        with _open_existing(args.store) as store:
            stats = store.stats()
            where = store.url
        if args.json:
            print(json.dumps({"store": where, **asdict(stats)}, indent=2))
            return 0
        print(f"store      {where} (schema v{stats.schema_version})")
        print(f"requests   {stats.total} ({stats.errors} with an error), {_when(stats.first)} .. {_when(stats.last)}")
        for path, n in stats.by_path.items():
            print(f"  path {path:12} {n:8}  {n / max(stats.total, 1):6.1%}")
        print(f"libraries  {len(stats.by_library)}")
        for lib in stats.by_library[:10]:
            print(f"  {lib['fingerprint'][:12]}  {lib['n_tools']:5} tools  {lib['requests']:8} requests")
        if len(stats.by_library) > 10:
            print(f"  ... {len(stats.by_library) - 10} more")
        print("feedback   " + ", ".join(f"{k} {stats.feedback.get(k, 0)}" for k in ("good", "bad", "none")))
        print(f"mined      {stats.labelled} labelled, {stats.simple} simple")
        return 0

    return _run(body)


def cmd_train_router(args: argparse.Namespace) -> int:
    from hyfunc.routing.router import RouterError, train_router_from_store

    def body() -> int:
        with _open_existing(args.store) as store:
            try:
                router = train_router_from_store(store, target=args.target, holdout=args.holdout,
                                                 use_small_answer=args.with_small_answer)
            except RouterError as e:
                raise StoreError(str(e)) from None
        router.save(args.out)
        m = router.manifest["calibration"]
        print(f"router -> {args.out}: threshold {router.threshold:.4f}, on held-out traffic "
              f"{m['share']:.1%} to the small path at {m['agreement']:.2%} agreement (target {args.target:.2%})")
        return 0

    return _run(body)


def cmd_selector(args: argparse.Namespace) -> int:
    from hyfunc.cascade.selector import prepare_selector

    _, metrics = prepare_selector(args.data, args.out, train=not args.identity, options={"epochs": args.epochs},
                                  seed=args.seed)
    v, c = metrics["validation"], metrics["calibration"]
    print(f"selector -> {args.out}: on {metrics['validation_examples']} held-out requests recall@1/3/5 "
          f"{v['recall@1']:.1%} / {v['recall@3']:.1%} / {v['recall@5']:.1%}, exact set {v['exact_set_accuracy']:.1%}, "
          f"refusals {v['refusal_accuracy']:.1%} (lexical weight {metrics['lexical_fit']['lexical_weight']:g}, "
          f"keep >= {c['threshold']:.3f}, refuse below {c['refusal_threshold']:.3f}; {metrics['seconds']:.0f} s)")
    return 0


def parse_period(text: str) -> float:
    """Seconds from "90", "30m", "1h", "1d"."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        value = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise StoreError(f"bad period {text!r}: use seconds or a number with s, m, h or d") from None
    if value <= 0:
        raise StoreError(f"a period must be positive, got {text!r}")
    return value


def cmd_cycle(args: argparse.Namespace) -> int:
    from hyfunc.methods.cascade import DEFAULT_ARTIFACT
    from hyfunc.models.registry import hyfunc_home
    from hyfunc.routing.cycle import CycleConfig, cycle_json, describe, run_cycle
    from hyfunc.routing.distil import DistilConfig
    from hyfunc.routing.routed import SharedEmbedder
    from hyfunc.routing.registry import open_versions
    from hyfunc.routing.versions import GateConfig

    def body() -> int:
        every = parse_period(args.every) if args.every else None
        window = parse_period(args.window) if args.window else None
        versions = open_versions(args.out or hyfunc_home() / "odia")
        embedder = SharedEmbedder()
        distil = DistilConfig(epochs=args.epochs, lora_rank=args.lora_rank, replay_fraction=args.replay_fraction,
                              max_items=args.max_items)
        gate = GateConfig(args.agreement_tolerance, args.accuracy_tolerance, args.latency_tolerance)
        with _open_existing(args.store) as store:
            while True:
                started = time.time()
                config = CycleConfig(target=args.target, small_first=args.small_first, holdout=args.holdout,
                                     min_requests=args.min_requests,
                                     since=None if window is None else started - window, replay_data=args.replay_data,
                                     distil_on=args.distil_on, labelled=args.labelled,
                                     selector=args.selector, engine=args.engine, gate=gate, distil=distil)
                try:
                    report = run_cycle(store, versions, args.artifact or DEFAULT_ARTIFACT, config, embedder)
                    print(json.dumps(cycle_json(report), indent=2, default=str) if args.json else describe(report), flush=True)
                except StoreUnavailable as e:
                    if every is None:
                        raise
                    print(f"error: {e}; retrying at the next cycle", file=sys.stderr, flush=True)
                if every is None:
                    return 0
                time.sleep(max(0.0, started + every - time.time()))

    try:
        return _run(body)
    except KeyboardInterrupt:
        return 0


def _versions(location: str | None):
    from pathlib import Path

    from hyfunc.models.registry import hyfunc_home
    from hyfunc.routing.registry import is_registry_url, open_versions

    if location and is_registry_url(location):
        return open_versions(location)
    path = Path(location) if location else hyfunc_home() / "odia"
    if not path.is_dir():
        raise StoreError(f"no versions at {path} (no cycle has run yet, or a wrong --dir)")
    return open_versions(path)


def cmd_status(args: argparse.Namespace) -> int:
    def body() -> int:
        versions = _versions(args.dir)
        champion, previous = versions.champion, versions.previous
        for m in versions.list():
            mark = "champion" if m["id"] == champion else "previous" if m["id"] == previous else ""
            x = m["metrics"]
            accuracy = "-" if x.get("accuracy") is None else f"{x['accuracy']:.2%}"
            labelled = "" if x.get("small_accuracy") is None else f"  small path on the labelled set {x['small_accuracy']:.2%}"
            print(f"{m['id']}  {mark:8}  share {x['share']:6.1%}  agreement {x['agreement']:7.2%}  "
                  f"accuracy {accuracy:>7}  latency {x['mean_latency'] * 1e3:8.1f} ms{labelled}  {m['note']}")
        return 0

    return _run(body)


def cmd_rollback(args: argparse.Namespace) -> int:
    from hyfunc.routing.versions import VersionError

    def body() -> int:
        try:
            champion = _versions(args.dir).rollback()
        except VersionError as e:
            raise StoreError(str(e)) from None
        print(f"champion -> {champion}")
        return 0

    return _run(body)
