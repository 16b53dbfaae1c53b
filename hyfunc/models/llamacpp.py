"""The llama.cpp engine: a GGUF model run by llama.cpp (through llama-cpp-python's low-level API).

On a CPU this is what a user would run instead of us (directly or through Ollama): decoding is
several times faster than transformers in float32 on the same quantised weights. The cascade
needs more than text generation, and llama.cpp's C API has all of it:

- last-layer hidden states of chosen positions (`llama_set_embeddings` with no pooling, then
  `llama_get_embeddings_ith`), for the soft token and the function embeddings;
- logits of chosen positions (the batch's `logits` flags), to verify drafted tokens in one pass;
- input embeddings instead of tokens (`llama_batch_init(n, n_embd, 1)`), for the soft token;
- several KV sequences in one context: a fixed prefix is computed once and each request forks it
  (`llama_memory_seq_cp`, which shares the cells, copies nothing) and crops it back
  (`llama_memory_seq_rm`).

Tokenization and chat templates are the model's Hugging Face tokenizer (read from the GGUF once),
as on the transformers engine, so ids and prompts are identical on both. Input embeddings (`embed`)
are the GGUF's `token_embd` rows, dequantised with the `gguf` package.

Several requests may use one backend from their own threads once `enable_batching()` is called:
their forward passes are merged into shared llama_decode calls (models/step_batcher.py), one
sequence id per request; the context's other operations (forks, crops) take its lock.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from hyfunc.config import hyfunc_home
from hyfunc.config import threads as env_threads
from hyfunc.models import interrupt
from hyfunc.models.base import BackendBase, StepOutput
from hyfunc.models.registry import DEFAULT_MODELS, ModelNotAvailable, resolve_gguf
from hyfunc.models.step_batcher import StepBatcher

__all__ = ["LlamaCppBackend", "LlamaKV", "engine_gguf", "llama_cpp_available", "requantize_gguf"]


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _lib():
    try:
        import llama_cpp
    except ImportError as err:
        raise ModelNotAvailable(
            "the llama.cpp engine needs llama-cpp-python: `make llamacpp` builds it into the venv "
            "(pip install llama-cpp-python==0.3.36, compiled from source)"
        ) from err
    return llama_cpp


def _silence(lib) -> None:
    """llama.cpp logs every load to stderr; keep errors only."""
    if getattr(_silence, "callback", None) is None:

        @lib.llama_log_callback
        def callback(level, text, user_data):  # noqa: ARG001
            if level == 4:  # GGML_LOG_LEVEL_ERROR
                os.write(2, text)

        _silence.callback = callback  # kept alive: llama.cpp holds the pointer
        lib.llama_log_set(callback, ctypes.c_void_p(0))


def requantize_gguf(source: Path, target: Path, gguf_type: str) -> None:
    """`source` rewritten in `gguf_type` by llama.cpp's quantizer (a few seconds for a 0.5B), atomically."""
    lib = _lib()
    _silence(lib)
    ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{gguf_type.upper()}", None)
    if ftype is None:
        raise ModelNotAvailable(f"llama.cpp has no GGUF type {gguf_type!r}")
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = ftype, True, env_threads() or os.cpu_count() or 1
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    if lib.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        partial.unlink(missing_ok=True)
        raise ModelNotAvailable(f"llama.cpp could not requantize {source} to {gguf_type}")
    partial.rename(target)


def engine_gguf(name: str) -> Path:
    """The GGUF file llama.cpp runs for `name`: a .gguf path as is; a default model's shipped file, or
    the copy in the type its registry entry names (`llamacpp_type`), made once next to the shipped file."""
    shipped = resolve_gguf(name)
    spec = DEFAULT_MODELS.get(name)
    if spec is None or spec.llamacpp_type is None:
        return shipped
    target = shipped.with_name(f"{name}.{spec.llamacpp_type}.gguf")
    if not target.is_file() or target.stat().st_mtime < shipped.stat().st_mtime:
        requantize_gguf(shipped, target, spec.llamacpp_type)
    return target


def _tokenizer_for(gguf: Path):
    """The GGUF's tokenizer as a Hugging Face tokenizer, built once and cached on disk."""
    from transformers import AutoTokenizer

    key = hashlib.sha256(f"{gguf.resolve()}:{gguf.stat().st_size}".encode()).hexdigest()[:16]
    directory = hyfunc_home() / "tokenizers" / f"{gguf.stem}-{key}"
    if not (directory / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


class LlamaKV:
    """One KV sequence of a llama.cpp context: `get_seq_length` and `crop` as transformers' cache.

    The sequence id returns to its backend's pool when this object is garbage-collected."""

    def __init__(self, backend: LlamaCppBackend, seq: int, length: int = 0):
        self.backend, self.seq, self.length = backend, seq, length
        self._finalizer = weakref.finalize(self, backend._release, seq)

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        keep = self.length + max_length if max_length < 0 else min(max_length, self.length)
        if keep < self.length:
            with self.backend._lock:
                self.backend._lib.llama_memory_seq_rm(self.backend._memory, self.seq, keep, -1)
            self.length = keep


@dataclass(eq=False)
class _Piece:
    """Tokens (ids or input embeddings) of one sequence, run in one llama_decode, maybe beside
    other requests' pieces."""

    kv: LlamaKV
    ids: list[int] | None
    embeds: np.ndarray | None
    outputs: list[int]  # offsets in the piece whose hidden states (or logits) llama.cpp outputs
    hidden: bool
    logit_rows: list[int]  # offsets among `outputs` whose logits are copied out (a vocabulary row each)
    logits: dict[int, np.ndarray] = field(default_factory=dict)
    states: dict[int, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids) if self.ids is not None else self.embeds.shape[0]


class LlamaCppBackend(BackendBase):
    engine = "llamacpp"

    def __init__(
        self, name: str, n_ctx: int = 32768, n_seq: int = 16, n_batch: int = 512, threads: int | None = None,
        gguf: str | Path | None = None,
    ):
        """`name`: a default model alias (in the file `engine_gguf` names) or a .gguf path; `gguf`: another
        file of that model to run (the cascade's small model with its adapter merged in). `n_seq`: KV sequences
        alive at once (a fixed library's prefix, a request's fork, the decoder's). `n_ctx`: KV cells
        shared by all of them (forks share their prefix's cells); a 1.5B model holds 28 KB per cell in f16."""
        lib = self._lib = _lib()
        _silence(lib)
        self.name = name
        self.device = torch.device("cpu")
        path = Path(gguf) if gguf is not None else engine_gguf(name)
        self.gguf_path = path
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        self._model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise ModelNotAvailable(f"llama.cpp could not load {path}")
        ctx_params = lib.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = ctx_params.n_ubatch = n_batch
        ctx_params.n_seq_max = n_seq
        ctx_params.kv_unified = True  # forks share the prefix's cells
        threads = threads or env_threads() or os.cpu_count() or 1
        ctx_params.n_threads = ctx_params.n_threads_batch = self._threads = threads
        ctx_params.pooling_type = lib.LLAMA_POOLING_TYPE_NONE
        ctx_params.embeddings = False  # switched on for passes that return hidden states
        self._ctx = lib.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            raise ModelNotAvailable(f"llama.cpp could not create a context for {path}")
        self._memory = lib.llama_get_memory(self._ctx)
        self._embeddings_on = False
        self._lock = threading.RLock()  # the context: one llama.cpp call at a time
        self._batcher: StepBatcher[_Piece] | None = None
        self._free = list(range(n_seq))
        self.n_batch, self.n_ctx = n_batch, n_ctx
        self._n_embd = lib.llama_model_n_embd(self._model)
        self._n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self._embd_batch = lib.llama_batch_init(n_batch, self._n_embd, 1)
        self._token_embd = None  # dequantised lazily, row by row
        # Another file of the model (a merged adapter) has the model's tokenizer: built once, for the model.
        self.tokenizer = _tokenizer_for(engine_gguf(name) if gguf is not None else path)
        self.eos_ids = self._eos_ids()

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        for batch in ("_batch", "_embd_batch"):
            if hasattr(self, batch):
                lib.llama_batch_free(getattr(self, batch))
        if getattr(self, "_ctx", None):
            lib.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            lib.llama_model_free(self._model)
            self._model = None

    @property
    def hidden_size(self) -> int:
        return self._n_embd

    @property
    def context_length(self) -> int:
        """What one sequence may hold: the model's trained context, within this context's cells."""
        return min(self.n_ctx, self._lib.llama_model_n_ctx_train(self._model))

    @property
    def description(self) -> str:
        return f"{self.name} on llama.cpp {self.gguf_path.name} ({self._threads} threads)"

    def _config_eos(self) -> Any:
        vocab = self._lib.llama_model_get_vocab(self._model)
        return [self._lib.llama_vocab_eos(vocab), self._lib.llama_vocab_eot(vocab)]

    # -- KV sequences ----------------------------------------------------------------------
    def _new_kv(self) -> LlamaKV:
        with self._lock:
            if not self._free:
                raise RuntimeError("llama.cpp engine: every KV sequence is in use (raise n_seq)")
            seq = self._free.pop(0)
            self._lib.llama_memory_seq_rm(self._memory, seq, -1, -1)
        return LlamaKV(self, seq)

    def _release(self, seq: int) -> None:
        if getattr(self, "_ctx", None):
            with self._lock:
                self._lib.llama_memory_seq_rm(self._memory, seq, -1, -1)
                self._free.append(seq)

    def fork(self, cache: LlamaKV) -> LlamaKV:
        copy = self._new_kv()
        with self._lock:
            self._lib.llama_memory_seq_cp(self._memory, cache.seq, copy.seq, -1, -1)
        copy.length = cache.length
        return copy

    # -- batching across requests -----------------------------------------------------------
    def enable_batching(self, on_run: Callable[[int], None] | None = None) -> None:
        """From now on forward passes from several threads are merged (see the module docstring);
        `on_run(n)` is told how many sequences each llama_decode ran."""
        if self._batcher is None:
            self._batcher = StepBatcher(self._run_pieces, self._fits, on_run=on_run)

    def _fits(self, group: list[_Piece], piece: _Piece) -> bool:
        """One llama_decode holds pieces of one kind (ids or embeddings; hidden states or not),
        different sequences, within the batch size."""
        first = group[0]
        return ((piece.ids is None) == (first.ids is None) and piece.hidden == first.hidden
                and all(piece.kv.seq != g.kv.seq for g in group) and sum(map(len, group)) + len(piece) <= self.n_batch)

    # -- input embeddings ------------------------------------------------------------------
    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        """(len, H) rows of the GGUF's token embedding table, dequantised."""
        if self._token_embd is None:
            from gguf import GGUFReader

            reader = GGUFReader(self.gguf_path)
            self._token_embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
        from gguf.quants import dequantize

        tensor = self._token_embd
        rows = np.asarray(tensor.data)[np.asarray(list(ids), dtype=np.int64)]
        return torch.from_numpy(np.ascontiguousarray(dequantize(rows, tensor.tensor_type), dtype=np.float32))

    # -- forward passes --------------------------------------------------------------------
    def _set_embeddings(self, on: bool) -> None:
        if on != self._embeddings_on:
            self._lib.llama_set_embeddings(self._ctx, on)
            self._embeddings_on = on

    def _decode(
        self, kv: LlamaKV, ids: Sequence[int] | None, embeds: np.ndarray | None, outputs: set[int], hidden: bool,
        logit_rows: set[int],
    ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """Run positions after `kv` in chunks of n_batch; hidden states of `outputs` (with `hidden`),
        logits of `logit_rows` only: a pass for hidden states outputs every position, and copying
        each one's vocabulary row would move ~0.6 MB per token for nothing."""
        n = len(ids) if ids is not None else embeds.shape[0]
        if kv.length + n > self.n_ctx:
            raise ValueError(f"{kv.length + n} tokens exceed the llama.cpp context of {self.n_ctx}")
        logits: dict[int, np.ndarray] = {}
        states: dict[int, np.ndarray] = {}
        for start in range(0, n, self.n_batch):
            end = min(start + self.n_batch, n)
            piece = _Piece(kv, list(ids[start:end]) if ids is not None else None,
                           embeds[start:end] if embeds is not None else None,
                           [i - start for i in range(start, end) if i in outputs], hidden,
                           [i - start for i in range(start, end) if i in logit_rows])
            if self._batcher is not None:
                self._batcher.submit(piece)
            else:
                self._run_pieces([piece])
            logits.update({start + i: row for i, row in piece.logits.items()})
            states.update({start + i: row for i, row in piece.states.items()})
        return logits, states

    def _run_pieces(self, pieces: list[_Piece]) -> None:
        """One llama_decode of every piece, each after its own sequence (see `_fits`)."""
        lib = self._lib
        with self._lock:
            hidden = pieces[0].hidden
            self._set_embeddings(hidden)
            batch = self._batch if pieces[0].ids is not None else self._embd_batch
            batch.n_tokens = sum(map(len, pieces))
            j = 0
            for piece in pieces:
                if piece.ids is not None:
                    for k, tid in enumerate(piece.ids):
                        batch.token[j + k] = tid
                else:
                    chunk = np.ascontiguousarray(piece.embeds, dtype=np.float32)
                    start = ctypes.cast(batch.embd, ctypes.c_void_p).value + j * self._n_embd * chunk.itemsize
                    ctypes.memmove(start, chunk.ctypes.data, chunk.nbytes)
                keep = set(piece.outputs)
                for k in range(len(piece)):
                    batch.pos[j + k] = piece.kv.length + k
                    batch.n_seq_id[j + k] = 1
                    batch.seq_id[j + k][0] = piece.kv.seq
                    batch.logits[j + k] = k in keep
                j += len(piece)
            self._check(lib.llama_decode(self._ctx, batch))
            j = 0
            for piece in pieces:
                for k in piece.logit_rows:
                    ptr = lib.llama_get_logits_ith(self._ctx, j + k)
                    piece.logits[k] = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()
                for k in piece.outputs if hidden else ():
                    ptr = lib.llama_get_embeddings_ith(self._ctx, j + k)
                    piece.states[k] = np.ctypeslib.as_array(ptr, shape=(self._n_embd,)).copy()
                piece.kv.length += len(piece)
                j += len(piece)

    def _check(self, status: int) -> None:
        if status == 1:  # llama.h: no KV slot for the batch
            raise RuntimeError(
                f"llama.cpp: the KV cache of {self.n_ctx} cells is full (the live sequences hold them: "
                "cached libraries, forks); load the model with a larger n_ctx"
            )
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")

    def forward(
        self, ids: Sequence[int] | None = None, embeds: torch.Tensor | None = None, cache: LlamaKV | None = None,
        logits_to_keep: int = 1, output_hidden: bool = False, hidden_to_keep: int | None = None,
    ) -> StepOutput:
        """Run new tokens (ids, or input embeddings (len, H)) after what `cache` holds (extended
        in place). Logits of the last `logits_to_keep` positions; with `output_hidden`, the
        last-layer hidden states of the last `hidden_to_keep` new positions (None: of all).

        With hidden states on, llama.cpp outputs every position of the batch, and so runs the
        vocabulary head for each (~20 % more time for the 1.5B on a CPU): positions whose hidden
        states are not wanted run first, with hidden states off."""
        if (ids is None) == (embeds is None):
            raise ValueError("pass exactly one of ids or embeds")
        interrupt.check()
        kv = cache if cache is not None else self._new_kv()
        array = embeds.detach().float().cpu().numpy() if embeds is not None else None
        n = len(ids) if ids is not None else array.shape[0]
        if n == 0:
            raise ValueError("nothing to run")
        tail = set(range(max(0, n - logits_to_keep), n))
        split = n - min(n, hidden_to_keep) if output_hidden and hidden_to_keep is not None else 0
        logits: dict[int, np.ndarray] = {}
        states: dict[int, np.ndarray] = {}
        for start, end, hidden in ((0, split, False), (split, n, output_hidden)):
            if start == end:
                continue
            wanted = {i - start for i in tail if start <= i < end}
            outputs = set(range(end - start)) if hidden else wanted
            part_ids = list(ids[start:end]) if ids is not None else None
            part_logits, part_states = self._decode(kv, part_ids, array[start:end] if array is not None else None,
                                                    outputs, hidden, wanted)
            logits.update({start + i: row for i, row in part_logits.items()})
            states.update({start + i: row for i, row in part_states.items()})
        kept = torch.from_numpy(np.stack([logits[i] for i in sorted(tail)]))
        hidden = torch.from_numpy(np.stack([states[i] for i in range(split, n)])) if output_hidden else None
        return StepOutput(
            logits=kept[-1], hidden=hidden, cache=kv, tail_logits=kept if logits_to_keep > 1 else None
        )

    def hidden_of_lines(self, prefix: LlamaKV, lines: list[list[int]]) -> list[torch.Tensor]:
        """Last-layer hidden states of each line after a fork of `prefix`, every line in its own
        KV sequence of one batch (no padding needed)."""
        interrupt.check()
        lib = self._lib
        total = sum(len(line) for line in lines)
        if total > self.n_batch or len(lines) > len(self._free):
            half = len(lines) // 2
            if half == 0:  # one line longer than a batch: run it alone
                return [self.forward(ids=lines[0], cache=self.fork(prefix), output_hidden=True).hidden]
            return self.hidden_of_lines(prefix, lines[:half]) + self.hidden_of_lines(prefix, lines[half:])
        forks = [self.fork(prefix) for _ in lines]
        with self._lock:
            self._set_embeddings(True)
            batch = self._batch
            batch.n_tokens = total
            j = 0
            for kv, line in zip(forks, lines):
                for k, tid in enumerate(line):
                    batch.token[j], batch.pos[j], batch.n_seq_id[j] = tid, kv.length + k, 1
                    batch.seq_id[j][0], batch.logits[j] = kv.seq, True
                    j += 1
            self._check(lib.llama_decode(self._ctx, batch))
            out, j = [], 0
            for line in lines:
                rows = [np.ctypeslib.as_array(lib.llama_get_embeddings_ith(self._ctx, j + k), shape=(self._n_embd,)).copy() for k in range(len(line))]
                out.append(torch.from_numpy(np.stack(rows)))
                j += len(line)
        return out  # the forks are released as they go out of scope

