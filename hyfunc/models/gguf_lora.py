"""A peft LoRA adapter (what `hyfunc prepare` trains on transformers) as a GGUF LoRA adapter, so the
llama.cpp engine applies it at load on top of the quantised base model: W x + (alpha / r) B A x,
the same function as the merged weights the transformers engine runs.

Written with the `gguf` package in the layout llama.cpp's `convert_lora_to_gguf.py` produces:
`general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, and for each adapted
weight `<gguf tensor name>.lora_a` (r, in) and `.lora_b` (out, r).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from hyfunc.config import hyfunc_home

# Hugging Face module names (Llama / Qwen2 / Mistral layout) -> llama.cpp's tensor names.
_MODULES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_KEY = re.compile(r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(\w+\.\w+)\.lora_([AB])\.weight$")


class AdapterNotConvertible(ValueError):
    """An adapter that the GGUF LoRA format (or this converter) cannot express."""


def _architecture(base_gguf: Path) -> str:
    from gguf import GGUFReader

    field = GGUFReader(base_gguf).fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def convert_adapter(adapter_dir: Path, base_gguf: Path, out_path: Path) -> Path:
    """Write `adapter_dir` (peft: adapter_config.json + adapter_model.safetensors) as GGUF."""
    from gguf import GGUFWriter
    from safetensors.torch import load_file  # numpy has no bfloat16 (an adapter may be stored in it)

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    unsupported = [k for k in ("use_dora", "use_rslora", "modules_to_save", "rank_pattern", "alpha_pattern") if config.get(k)]
    if unsupported or config.get("peft_type") != "LORA":
        raise AdapterNotConvertible(f"{adapter_dir}: only plain LoRA converts to GGUF (has {unsupported or config.get('peft_type')})")
    tensors = load_file(adapter_dir / "adapter_model.safetensors")
    writer = GGUFWriter(str(out_path), _architecture(base_gguf))
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(config["lora_alpha"]))
    for key in sorted(tensors):
        match = _KEY.search(key)
        if match is None or match.group(2) not in _MODULES:
            raise AdapterNotConvertible(f"{adapter_dir}: no GGUF name for adapter tensor {key}")
        layer, module, side = match.groups()
        name = f"blk.{layer}.{_MODULES[module]}.weight.lora_{side.lower()}"
        writer.add_tensor(name, np.ascontiguousarray(tensors[key].float().numpy()))  # bf16 stored: f32 here
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def cached_adapter_gguf(adapter_dir: Path, base_gguf: Path) -> Path:
    """The GGUF form of an adapter, converted once (a second or two) and cached in $HYFUNC_HOME
    by the adapter's content: the artifact itself stays as `hyfunc prepare` wrote it."""
    digest = hashlib.sha256((adapter_dir / "adapter_model.safetensors").read_bytes()).hexdigest()[:16]
    out = hyfunc_home() / "adapters" / f"{adapter_dir.parent.name}-{digest}.gguf"
    if not out.is_file():
        partial = out.with_suffix(".partial")
        convert_adapter(adapter_dir, base_gguf, partial)
        partial.rename(out)
    return out
