"""A resumable cache of per-example tensors: safetensors shards whose metadata lists the example ids
they hold. A rerun with another sample or more data computes only the ids not cached yet; a shard
is written whole or not at all."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from hyfunc.durable import durable_replacement


def shard_ids(directory: Path) -> dict[str, Path]:
    """example id -> the shard holding it."""
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.update(dict.fromkeys(json.loads(f.metadata()["ids"]), path))
    return out


def fill_shards(
    directory: Path, ids: Sequence[str], compute: Callable[[list[str], Callable[[], None]], dict[str, torch.Tensor]],
    shard_size: int, desc: str,
) -> None:
    """Write shards for the ids not cached yet. `compute(chunk_ids, tick)` returns one shard's
    tensors for `chunk_ids` and calls `tick()` once per example (progress)."""
    directory.mkdir(parents=True, exist_ok=True)
    done = shard_ids(directory)
    todo = [i for i in ids if i not in done]
    number = len(list(directory.glob("*.safetensors")))
    with tqdm(total=len(ids), initial=len(ids) - len(todo), desc=desc) as bar:
        for start in range(0, len(todo), shard_size):
            chunk = todo[start : start + shard_size]
            tensors = compute(chunk, lambda: bar.update(1))
            path = directory / f"{number:05d}.safetensors"
            with durable_replacement(path) as shard:
                save_file(tensors, str(shard), metadata={"ids": json.dumps(chunk)})
            number += 1


def read_shards(directory: Path, ids: set[str] | None = None) -> Iterator[tuple[list[str], dict[str, torch.Tensor]]]:
    """(ids, tensors) of every shard holding one of `ids` (default: every shard)."""
    for path in sorted({p for i, p in shard_ids(directory).items() if ids is None or i in ids}):
        with safe_open(str(path), "pt") as f:
            held = json.loads(f.metadata()["ids"])
        yield held, load_file(str(path))
