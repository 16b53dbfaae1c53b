"""Versions of what a cycle produces (router, later the distilled small model), and the gate that
decides whether a candidate replaces the champion.

- A version is immutable: a directory with a `manifest.json` (parents, data window, metrics,
  created), built in a temporary directory, fsynced and renamed into place (hyfunc.durable), so a
  reader never sees a half-written version and a crash leaves only a stray temporary directory.
- Aliases: `champion` and the stack of earlier champions. Promotion and rollback read, change and
  write them as one step under a lock, so two processes promoting and rolling back at once never
  lose an update, and a server polling the champion switches from one complete version to another.
- Where they live: `Versions`, a directory (`versions/<id>/`, `aliases.json` rewritten durably
  under a file lock) for one machine; `registry.PostgresVersions`, PostgreSQL (row locks, files
  content-addressed in the database), for replicas. `registry.open_versions` picks by location.
- The gate refuses a candidate whose agreement with the large path, accuracy, or small path's
  accuracy on a labelled set drops by more than a tolerance, or whose latency grows; it says why.
"""
from __future__ import annotations

import fcntl
from abc import ABC, abstractmethod
import json
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from hyfunc.durable import durable_replacement, write_durably


class VersionError(RuntimeError):
    pass


@dataclass(frozen=True)
class Metrics:
    """A version measured on held-out traffic."""

    agreement: float  # share of requests answered as the large path answered them
    share: float  # share of requests served by the small path
    mean_latency: float  # seconds per request, routed system
    accuracy: float | None = None  # against a labelled holdout (feedback, gold), when there is one
    # The small path alone against gold on a fixed labelled set (fc-train validation): a distilled
    # student can copy its teacher's mistakes, which agreement with the teacher cannot show.
    small_accuracy: float | None = None


@dataclass(frozen=True)
class GateConfig:
    agreement_tolerance: float = 0.005  # may drop by at most this much (absolute)
    accuracy_tolerance: float = 0.01
    latency_tolerance: float = 0.0  # relative growth allowed: 0 = must not get slower


@dataclass
class Verdict:
    promote: bool
    reasons: list[str] = field(default_factory=list)


def gate(champion: Metrics | None, candidate: Metrics, config: GateConfig = GateConfig()) -> Verdict:
    """Promote unless the candidate regresses beyond the tolerances (a first version always passes)."""
    if champion is None:
        return Verdict(True, ["no champion yet"])
    reasons: list[str] = []
    if candidate.agreement < champion.agreement - config.agreement_tolerance:
        reasons.append(f"agreement with the large path {candidate.agreement:.2%} < champion's "
                       f"{champion.agreement:.2%} - {config.agreement_tolerance:.2%}")
    if champion.accuracy is not None:
        if candidate.accuracy is None:
            reasons.append("candidate was not scored on the labelled holdout")
        elif candidate.accuracy < champion.accuracy - config.accuracy_tolerance:
            reasons.append(f"accuracy {candidate.accuracy:.2%} < champion's {champion.accuracy:.2%} - "
                           f"{config.accuracy_tolerance:.2%}")
    if champion.small_accuracy is not None:
        if candidate.small_accuracy is None:
            reasons.append("candidate's small path was not scored on the labelled set")
        elif candidate.small_accuracy < champion.small_accuracy - config.accuracy_tolerance:
            reasons.append(f"small path's accuracy on the labelled set {candidate.small_accuracy:.2%} < "
                           f"champion's {champion.small_accuracy:.2%} - {config.accuracy_tolerance:.2%}")
    if candidate.mean_latency > champion.mean_latency * (1 + config.latency_tolerance):
        reasons.append(f"mean latency {candidate.mean_latency * 1e3:.1f} ms > champion's "
                       f"{champion.mean_latency * 1e3:.1f} ms")
    return Verdict(not reasons, reasons or ["no regression"])


def new_version_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def version_manifest(vid: str, metrics: Metrics, parents: list[str], window: dict | None, note: str) -> dict:
    return {"id": vid, "created": time.time(), "parents": parents, "window": window or {},
            "metrics": asdict(metrics), "note": note}


class VersionStore(ABC):
    """Where versions and their aliases live; see the module docstring."""

    scratch: Path  # a local directory for work in progress (a cycle's training)

    @abstractmethod
    def create(self, build: Callable[[Path], None], *, metrics: Metrics, parents: list[str],
               window: dict | None = None, note: str = "") -> str:
        """Build a version with `build(directory)` and freeze it; returns its id."""

    @abstractmethod
    def path(self, vid: str) -> Path:
        """A local directory holding the version's files."""

    @abstractmethod
    def manifest(self, vid: str) -> dict:
        """The version's manifest (id, created, parents, window, metrics, note)."""

    @abstractmethod
    def list(self) -> list[dict]:
        """Every version's manifest, oldest first."""

    @abstractmethod
    def aliases(self) -> dict:
        """{"champion": id or None, "history": earlier champions, oldest first}."""

    @abstractmethod
    def promote(self, vid: str) -> None:
        """Make `vid` the champion; the current one goes on the history stack."""

    @abstractmethod
    def rollback(self) -> str:
        """Make the previous champion the champion again; returns it."""

    def metrics(self, vid: str) -> Metrics:
        return Metrics(**self.manifest(vid)["metrics"])

    @property
    def champion(self) -> str | None:
        return self.aliases()["champion"]

    @property
    def previous(self) -> str | None:
        history = self.aliases()["history"]
        return history[-1] if history else None

    def consider(self, build: Callable[[Path], None], metrics: Metrics, config: GateConfig = GateConfig(),
                 window: dict | None = None) -> tuple[str, Verdict]:
        """Freeze a candidate (kept either way, for the record) and promote it if the gate passes."""
        champion = self.champion
        verdict = gate(None if champion is None else self.metrics(champion), metrics, config)
        vid = self.create(build, metrics=metrics, parents=[champion] if champion else [], window=window,
                          note="; ".join(verdict.reasons))
        if verdict.promote:
            self.promote(vid)
        return vid, verdict


def promoted(aliases: dict, vid: str) -> dict:
    if aliases["champion"] == vid:
        return aliases
    history = aliases["history"] + ([aliases["champion"]] if aliases["champion"] is not None else [])
    return {"champion": vid, "history": history}


def rolled_back(aliases: dict) -> dict:
    if not aliases["history"]:
        raise VersionError("nothing to roll back to: no earlier champion")
    return {"champion": aliases["history"][-1], "history": aliases["history"][:-1]}


class Versions(VersionStore):
    """Versions in a directory: one machine, or a path every process mounts."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        (self.root / "versions").mkdir(parents=True, exist_ok=True)
        self.scratch = self.root / "work"

    def __str__(self) -> str:
        return str(self.root)

    # -- versions ----------------------------------------------------------------------------
    def create(self, build: Callable[[Path], None], *, metrics: Metrics, parents: list[str],
               window: dict | None = None, note: str = "") -> str:
        vid = new_version_id()
        with durable_replacement(self.root / "versions" / vid) as directory:
            directory.mkdir()
            build(directory)
            manifest = version_manifest(vid, metrics, parents, window, note)
            (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))
        return vid

    def path(self, vid: str) -> Path:
        p = self.root / "versions" / vid
        if not (p / "manifest.json").is_file():
            raise VersionError(f"no version {vid!r} under {self.root}")
        return p

    def manifest(self, vid: str) -> dict:
        return json.loads((self.path(vid) / "manifest.json").read_text())

    def list(self) -> list[dict]:
        # A dot-directory is a version a crash interrupted before its rename into place.
        found = [json.loads(p.read_text()) for p in (self.root / "versions").glob("*/manifest.json")
                 if not p.parent.name.startswith(".")]
        return sorted(found, key=lambda m: m["created"])

    # -- aliases -----------------------------------------------------------------------------
    def aliases(self) -> dict:
        f = self.root / "aliases.json"
        return json.loads(f.read_text()) if f.is_file() else {"champion": None, "history": []}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Readers need no lock (the file is replaced whole); writers must not interleave their
        # read-change-write, or one's update is lost.
        with open(self.root / "aliases.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def promote(self, vid: str) -> None:
        self.path(vid)  # must exist
        with self._locked():
            aliases = self.aliases()
            if aliases["champion"] != vid:
                write_durably(self.root / "aliases.json", json.dumps(promoted(aliases, vid), indent=2))

    def rollback(self) -> str:
        with self._locked():
            aliases = rolled_back(self.aliases())
            write_durably(self.root / "aliases.json", json.dumps(aliases, indent=2))
        return aliases["champion"]
