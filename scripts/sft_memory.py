"""Peak RSS of the distillation's SFT on the 4 longest fc-train (train split) small prompts, with and without
gradient checkpointing: `python scripts/sft_memory.py plain|ckpt` (reports/odia-library-side-by-side)."""
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from hyfunc.cascade.data import load_examples, split_examples
from hyfunc.cascade.prepare import PrepareConfig, train_small
from hyfunc.cascade.small_model import build_small_prompt
from hyfunc.data import FC_TRAIN
from hyfunc.models.backend import Backend
from hyfunc.routing.distil import distil_items

ckpt = sys.argv[1] == "ckpt"  # "plain" or "ckpt"
train, _ = split_examples(load_examples([FC_TRAIN]))
callers = [ex for ex in train if ex.answers]
small = Backend("qwen-coder-0.5b", dtype=torch.float32)
longest = sorted(callers, key=lambda ex: -len(build_small_prompt(small, ex.query, ex.tools, with_soft_token=False)))[:4]
items, skipped = distil_items(longest, small)
print("prompt tokens", [len(i.prompt) for i in items], "skipped", skipped, flush=True)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with tempfile.TemporaryDirectory() as d:
    cfg = PrepareConfig(large_model="", small_model="qwen-coder-0.5b", data=[], sft_epochs=1, sft_grad_accum=4, lora_rank=16,
                        sft_gradient_checkpointing=ckpt)
    t = time.perf_counter()
    train_small(Path(d), small, None, items, cfg)
    secs = time.perf_counter() - t
print(json.dumps({"checkpointing": ckpt, "peak_rss_gb_before_sft": before / 1e6, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, "sft_seconds": secs}))
