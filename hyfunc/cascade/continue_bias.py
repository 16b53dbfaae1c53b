"""Calibrating the decoder's continue bias: how readily the small model writes another call.

The small model decides after each call whether another follows, and on requests that ask for the
same tool several times it stops too early (BFCL's parallel categories). `TemplateDecoder` adds
`continue_bias` to the logit of going on; a list that goes on with a word-for-word repeat is
taken back by the repeat guard, so a bias mostly costs requests whose model would go on with a
*different* spurious call. The bias is chosen on validation requests (never BFCL): the cascade
answers each with every bias of a grid (one shared large-model pass per request), and the largest
bias that leaves no fewer answers exactly right than no bias is kept — as far towards more calls
as validation allows without a loss. The choice is written into the artifact's manifest
(``"decoder": {"continue_bias": ...}``), which `HyFuncMethod.load` reads.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from hyfunc.cascade.data import Example, call_pattern, load_examples, sample_by_pattern, split_examples
from hyfunc.cascade.manifest import MANIFEST, write_manifest
from hyfunc.formats.calls import same_calls

GRID = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)


def validation_callers(data: Sequence[str], n: int, seed: int = 0, val_fraction: float = 0.1) -> list[Example]:
    """`n` requests with calls from the validation side of the data's hash split (which no
    preparation trains on: `split_examples` is stable), sampled with equal shares per call pattern."""
    _, val = split_examples(load_examples(list(data)), val_fraction)
    callers = [ex for ex in val if ex.answers and ex.tools]
    return sample_by_pattern(callers, n, seed)


def calibrate_continue_bias(method, examples: Sequence[Example], grid: Sequence[float] = GRID) -> dict:
    """Answer `examples` with the cascade `method` (a `HyFuncMethod`) at every bias of `grid`;
    returns the chosen bias and the curve (exact answers, more / fewer calls than gold, per bias
    and per call pattern)."""
    grid = sorted(set(float(b) for b in grid) | {0.0})
    variants = []
    for b in grid:
        v = method.variant(replace(method.options), f"{method.name}+continue{b:g}")
        v.decoder.continue_bias = b
        variants.append(v)
    rows = []
    for ex in tqdm(examples, desc="continue bias", unit="request"):
        row = {"id": ex.id, "pattern": call_pattern(ex), "gold": len(ex.answers), "calls": [], "exact": []}
        for v in variants:  # the same request back to back: its large-model pass is shared
            calls = v.answer([{"role": "user", "content": ex.query}], ex.tools).calls
            row["calls"].append(len(calls))
            row["exact"].append(same_calls(calls, ex.answers))
        rows.append(row)
    curve = []
    for j, b in enumerate(grid):
        point = {"bias": b, "exact": sum(r["exact"][j] for r in rows),
                 "more_calls": sum(r["calls"][j] > r["gold"] for r in rows),
                 "fewer_calls": sum(r["calls"][j] < r["gold"] for r in rows), "by_pattern": {}}
        for pattern in sorted({r["pattern"] for r in rows}):
            rs = [r for r in rows if r["pattern"] == pattern]
            point["by_pattern"][pattern] = {"requests": len(rs), "exact": sum(r["exact"][j] for r in rs)}
        curve.append(point)
    unbiased = curve[0]["exact"]
    chosen = max(p["bias"] for p in curve if p["exact"] >= unbiased)
    return {"continue_bias": chosen, "requests": len(rows), "exact_without_bias": unbiased, "curve": curve}


def write_continue_bias(artifact: Path, result: dict, data: Sequence[str], seconds: float) -> None:
    """Record the calibration in the artifact's manifest (the decoder reads `continue_bias`)."""
    from hyfunc.cascade.prepare import data_hash  # prepare's own stages import this module

    path = Path(artifact) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["decoder"] = {"continue_bias": result["continue_bias"]}
    manifest.setdefault("metrics", {})["continue_bias"] = {
        **result, "data": {"paths": list(data), "sha256": data_hash(list(data))},
    }
    manifest.setdefault("seconds", {})["continue_bias"] = seconds
    write_manifest(Path(artifact), manifest)


def add_continue_bias(artifact: Path, data: Sequence[str], requests: int = 90, seed: int = 0,
                      grid: Sequence[float] = GRID, method=None, val_fraction: float = 0.1) -> dict:
    """Calibrate the continue bias of an existing cascade artifact on `data`'s validation side and
    record it in its manifest; returns the calibration. `method`: the artifact already loaded."""
    from hyfunc.methods.cascade import HyFuncMethod

    started = time.perf_counter()
    method = method or HyFuncMethod.load(artifact)
    result = calibrate_continue_bias(method, validation_callers(data, requests, seed, val_fraction), grid)
    write_continue_bias(artifact, result, data, time.perf_counter() - started)
    method.decoder.continue_bias = result["continue_bias"]
    return result
