"""`hyfunc models`: the default models, what `--engine auto` runs here, and converting them ahead of time."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from hyfunc.errors import InputError
from hyfunc.models.engines import resolve_engine
from hyfunc.models.registry import DEFAULT_LARGE, DEFAULT_MODELS, resolve_model


def add_models_parser(subparsers: Any) -> argparse.ArgumentParser:
    models = subparsers.add_parser("models", help="list the default models, or prepare (assemble + convert) them")
    models.add_argument("--prepare", nargs="+", metavar="NAME")
    models.set_defaults(func=cmd_models)
    return models


def cmd_models(args: argparse.Namespace) -> int:
    if args.prepare:
        for name in args.prepare:
            # Only the default aliases and local .gguf files are converted; anything else has
            # nothing to prepare, and saying "done" for a typo would hide it.
            if name not in DEFAULT_MODELS and not (name.endswith(".gguf") and Path(name).is_file()):
                raise InputError(f"cannot prepare {name!r}: not a default alias ({', '.join(DEFAULT_MODELS)}) or an existing .gguf file")
        for name in args.prepare:
            start = time.perf_counter()
            print(f"{name}: {resolve_model(name)} ({time.perf_counter() - start:.1f}s)")
        return 0
    for spec in DEFAULT_MODELS.values():
        on_llamacpp = f"; llama.cpp runs it as {spec.llamacpp_type.upper()}" if spec.llamacpp_type else ""
        print(f"{spec.alias:18} {spec.upstream}{on_llamacpp}")
    from torch import device as torch_device

    from hyfunc.models.backend import default_dtype

    # What `--engine auto` runs here, and in which precision (hyfunc.models.engines.resolve_engine).
    picks = {role: resolve_engine("auto", DEFAULT_LARGE, None, role) for role in ("large", "small", "direct")}
    dtype = str(default_dtype(torch_device("cpu"))).removeprefix("torch.")
    print(
        f"engine auto on this machine: cascade large model {picks['large']}, small model {picks['small']}, "
        f"direct prompting {picks['direct']} (transformers dtype {dtype}; llama.cpp runs the GGUF's quantisation)"
    )
    return 0
