"""A peft LoRA adapter (what `hyfunc prepare` trains on transformers) merged into a GGUF for llama.cpp,
as the transformers engine merges it: a copy of the base file whose adapted weights are W + (alpha / r) B A,
dequantised, summed in float32 and quantised again (in Q8_0, or the base tensor's float type).

Why not llama.cpp's LoRA adapters applied at load: they add two small matmuls per adapted weight, which
slow every prefill and decode step of the small model on a CPU (`reports/merged-adapter/`).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from hyfunc.config import hyfunc_home
from hyfunc.disk_cache import hold, trim
from hyfunc.durable import durable_replacement

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
    """An adapter that this merge cannot express (DoRA, extra trained modules, unknown weights)."""


def _lora_tensors(adapter_dir: Path) -> tuple[float, dict[str, np.ndarray]]:
    """(alpha / r, {llama.cpp's adapter tensor name `blk.<i>.<module>.weight.lora_<a|b>`: float32 array})."""
    from safetensors.torch import load_file  # numpy has no bfloat16 (an adapter may be stored in it)

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    unsupported = [k for k in ("use_dora", "use_rslora", "modules_to_save", "rank_pattern", "alpha_pattern") if config.get(k)]
    if unsupported or config.get("peft_type") != "LORA":
        raise AdapterNotConvertible(f"{adapter_dir}: only a plain LoRA adapter merges (has {unsupported or config.get('peft_type')})")
    named = {}
    for key, tensor in load_file(adapter_dir / "adapter_model.safetensors").items():
        match = _KEY.search(key)
        if match is None or match.group(2) not in _MODULES:
            raise AdapterNotConvertible(f"{adapter_dir}: no GGUF name for adapter tensor {key}")
        layer, module, side = match.groups()
        named[f"blk.{layer}.{_MODULES[module]}.weight.lora_{side.lower()}"] = np.ascontiguousarray(tensor.float().numpy())
    return float(config["lora_alpha"]) / float(config["r"]), named


def merge_adapter(adapter_dir: Path, base_gguf: Path, out_path: Path) -> Path:
    """Write a copy of `base_gguf` with `adapter_dir` merged into its weights (see the module's docstring)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    scale, lora = _lora_tensors(adapter_dir)
    floats = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
    reader = GGUFReader(base_gguf)
    writer = GGUFWriter(str(out_path), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        # The architecture and the GGUF.* fields are written by GGUFWriter itself.
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    merged: dict[str, tuple[np.ndarray, GGMLQuantizationType]] = {}
    for tensor in reader.tensors:
        a, b = lora.pop(f"{tensor.name}.lora_a", None), lora.pop(f"{tensor.name}.lora_b", None)
        if a is None or b is None:
            continue
        weight = dequantize(tensor.data, tensor.tensor_type).astype(np.float32) + scale * (b @ a)
        # Rounding the sum again in a 4-bit type would add noise as large as the adapter's change.
        kind = tensor.tensor_type if tensor.tensor_type in floats else GGMLQuantizationType.Q8_0
        merged[tensor.name] = (quantize(weight, kind), kind)
    if lora:
        raise AdapterNotConvertible(f"{adapter_dir}: {len(lora)} adapter tensors match no weight of {base_gguf.name}, "
                                    f"e.g. {sorted(lora)[0]}")
    for tensor in reader.tensors:
        data, kind = merged.get(tensor.name, (tensor.data, tensor.tensor_type))
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, kind)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(merged.get(tensor.name, (tensor.data,))[0], tensor_endianess=reader.endianess)
    writer.close()
    return out_path


#: Bytes of merged models kept in $HYFUNC_HOME/merged, the least recently used removed first: each is a whole
#: model (675 MB for the 0.5B in Q8_0), and every ODIA candidate distilled brings a new adapter.
MERGED_CACHE_BYTES = 3 * 1024**3


def cached_merged_gguf(adapter_dir: Path, base_gguf: Path) -> Path:
    """The base GGUF with the adapter merged in, written once and cached in $HYFUNC_HOME by the adapter's
    content and the base file: the artifact stays as `hyfunc prepare` wrote it."""
    digest = hashlib.sha256((adapter_dir / "adapter_model.safetensors").read_bytes())
    digest.update(f"{base_gguf.resolve()}:{base_gguf.stat().st_size}:{base_gguf.stat().st_mtime_ns}".encode())
    name = f"{adapter_dir.parent.name}-{base_gguf.stem}-{digest.hexdigest()[:16]}"
    root = hyfunc_home() / "merged"
    with hold(root / name) as entry:
        out = entry / f"{name}.gguf"
        if not out.is_file():
            with durable_replacement(out) as partial:
                merge_adapter(adapter_dir, base_gguf, partial)
        # Held, this entry stays; a model already loaded stays readable after its file is removed (POSIX).
        trim(root, MERGED_CACHE_BYTES)
    return out
