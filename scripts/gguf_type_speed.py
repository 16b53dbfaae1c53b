"""How fast llama.cpp reads a prompt and decodes with a default model in its shipped GGUF file and in
requantized copies, side by side in one process: the measurement behind `DefaultModel.llamacpp_type`.

    python scripts/gguf_type_speed.py --model qwen-coder-0.5b --types q8_0 q4_0 --prompt 200 \
        --adapter hyfunc/data/cascade/adapter --out speed-0.5b.json

Per variant: the median over `--repeats` (after one warm-up) of a `--prompt`-token prefill, and of `--passes`
decode passes of `--pass-tokens` tokens each on its KV cache (the templating decoder's passes write a
value token plus the forced template tokens after it). Copies are written to a temporary folder.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hyfunc.eval.provenance import provenance
from hyfunc.models.gguf_lora import merge_adapter
from hyfunc.models.llamacpp import LlamaCppBackend, requantize_gguf
from hyfunc.models.registry import resolve_gguf


def _time(backend: LlamaCppBackend, args: argparse.Namespace) -> dict[str, float]:
    prompt = list(range(1000, 1000 + args.prompt))
    prefill, decode = [], []
    for _ in range(args.repeats + 1):
        started = time.perf_counter()
        cache = backend.forward(ids=prompt).cache
        prefill.append(time.perf_counter() - started)
        started = time.perf_counter()
        for k in range(args.passes):
            backend.forward(ids=[2000 + k * args.pass_tokens + j for j in range(args.pass_tokens)], cache=cache)
        decode.append(time.perf_counter() - started)
        del cache
    return {"prefill_s": statistics.median(prefill[1:]), "decode_s": statistics.median(decode[1:])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a default model alias")
    parser.add_argument("--types", nargs="+", default=["q8_0"], help="GGUF types to requantize to (llama.cpp's names)")
    parser.add_argument("--adapter", help="a peft LoRA directory merged into every variant (as the engine runs it)")
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--pass-tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    shipped = resolve_gguf(args.model)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for gguf_type in ["shipped", *args.types]:
            path = shipped
            if gguf_type != "shipped":
                path = Path(tmp) / f"{args.model}.{gguf_type}.gguf"
                requantize_gguf(shipped, path, gguf_type)
            if args.adapter:
                path = merge_adapter(Path(args.adapter), path, Path(tmp) / f"{path.stem}.merged.gguf")
            backend = LlamaCppBackend(args.model, gguf=path, n_ctx=4096, n_seq=4)
            rows[gguf_type] = {"file_bytes": path.stat().st_size, **_time(backend, args)}
            del backend
            print(gguf_type, json.dumps(rows[gguf_type]), flush=True)
    out = {"command": sys.argv, "provenance": provenance(), "model": args.model, "adapter": args.adapter,
           "prompt_tokens": args.prompt, "passes": args.passes, "pass_tokens": args.pass_tokens,
           "repeats": args.repeats, "variants": rows}
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
