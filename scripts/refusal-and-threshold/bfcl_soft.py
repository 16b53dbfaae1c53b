"""Soft tokens (large-model pass only) of the first 25 cases per BFCL category, for refusal-head study."""
import torch
from safetensors.torch import save_file
from hyfunc.eval.bfcl import load_cases
from hyfunc.formats.schema import parse_tools
from hyfunc.models.backend import Backend
from hyfunc.cascade.soft_token import SoftTokenEncoder
import json
from pathlib import Path
REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "reports" / "refusal-and-threshold"
cats = ["simple_python","multiple","parallel","parallel_multiple","irrelevance","live_simple","live_multiple","live_parallel","live_parallel_multiple","live_irrelevance"]
enc = SoftTokenEncoder(Backend("qwen-coder-1.5b"))
ids, soft = [], []
for c in cats:
    for case in load_cases(c, limit=25):
        e = enc.encode(case.messages, parse_tools(case.functions))
        ids.append(case.id); soft.append(e.soft_token.float())
        print(case.id, flush=True)
save_file({"soft": torch.stack(soft)}, OUT / "bfcl_soft.safetensors")
json.dump(ids, open(OUT / "bfcl_ids.json", "w"))
