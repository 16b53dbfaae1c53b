"""Serve fc-train training-split requests through the shipped cascade with traffic logging, as a
server with `--traffic` would: a traffic store of teacher answers for `hyfunc odia cycle`.

    python scripts/log_cascade_traffic.py --n 200 --store traffic.sqlite

The requests are `hyfunc bench odia`'s stream (same split, same shuffle): its first 120 are the
ones reports/cpu-llamacpp/odia-small-first/ served. Stopped early, the store keeps what was served.
"""
from __future__ import annotations

import argparse

from tqdm import tqdm

from hyfunc.data import FC_TRAIN
from hyfunc.eval.odia_bench import OdiaBenchConfig, scenario
from hyfunc.methods.cascade import DEFAULT_ARTIFACT, HyFuncMethod
from hyfunc.routing.recording import RecordedMethod
from hyfunc.routing.traffic import TrafficLog


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, required=True, help="requests to serve")
    parser.add_argument("--store", required=True, help="SQLite path or postgresql:// URL")
    parser.add_argument("--data", nargs="+", default=[str(FC_TRAIN)])
    parser.add_argument("--engine", default="auto")
    args = parser.parse_args()

    stream, _ = scenario(args.data, None, OdiaBenchConfig(stream=args.n, held_out=1))
    cascade = HyFuncMethod.load(DEFAULT_ARTIFACT, large_engine=args.engine, small_engine=args.engine)
    log = TrafficLog(args.store, flush_interval=0.05)
    try:
        system = RecordedMethod(cascade, log)
        for ex in tqdm(stream, unit="req", mininterval=30):
            system.answer([{"role": "user", "content": ex.query}], ex.tools)
    finally:
        print(log.close(timeout=60))  # what was written, dropped or lost
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
