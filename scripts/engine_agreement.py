"""Agreement of the large model's cascade outputs on the two engines, on BFCL prompts (2 per category):
cosine of the soft tokens and of the function embeddings, transformers (bf16 here) vs llama.cpp (the GGUF).

    python scripts/engine_agreement.py
"""
import torch
from hyfunc.cascade.soft_token import SoftTokenEncoder
from hyfunc.eval.bfcl import load_cases, CATEGORIES
from hyfunc.formats.schema import parse_tools
from hyfunc.models.engines import load_backend
tf = SoftTokenEncoder(load_backend("qwen-coder-1.5b", "transformers"))
ll = SoftTokenEncoder(load_backend("qwen-coder-1.5b", "llamacpp"))
soft, fn = [], []
for cat in CATEGORIES:
    for case in load_cases(cat, limit=2):
        tools = parse_tools(case.functions)
        a, b = tf.encode(case.messages, tools), ll.encode(case.messages, tools)
        soft.append(float(torch.nn.functional.cosine_similarity(a.soft_token, b.soft_token, dim=0)))
        fn += torch.nn.functional.cosine_similarity(a.function_embeddings, b.function_embeddings, dim=-1).tolist()
print(f"soft token cosine over {len(soft)} BFCL prompts: min {min(soft):.4f} mean {sum(soft)/len(soft):.4f}")
print(f"function embedding cosine over {len(fn)} tools: min {min(fn):.4f} mean {sum(fn)/len(fn):.4f}")
