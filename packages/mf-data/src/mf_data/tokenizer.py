"""SentencePiece models: loading one for preprocessing, training one from a jsonl corpus.

sentencepiece is the optional `tokenizer` extra (`pip install "mf-data[tokenizer]"`); everything
else in mf-data works without it. Errors (missing package, unreadable model, impossible vocabulary
size) become one-line `InputError`s.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .errors import InputError
from .fsutil import atomic_write_bytes
from .jsonl import iter_documents

_ENCODE_BATCH = 256  # texts per sentencepiece call in encode_arrays (~40 ms of work each)


def _spm() -> Any:
    try:
        import sentencepiece
    except ImportError:
        raise InputError("sentencepiece is not installed: pip install 'mf-data[tokenizer]'") from None
    return sentencepiece


class SentencePieceTokenizer:
    """A loaded `.model`: `vocab_size`, `eod` (the model's end-of-sentence id), `bos`, batch
    `encode`, `decode`, and as HFTokenizer names them: `special_tokens` (name -> piece text),
    `token_to_id(text)` and `chat_template` (None: a sentencepiece model carries none)."""

    chat_template = None

    def __init__(self, model_path: str) -> None:
        self.model_path = os.fspath(model_path)
        if not os.path.isfile(self.model_path):
            raise InputError(f"{self.model_path}: tokenizer model not found")
        spm = _spm()
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(self.model_path)
        except (OSError, RuntimeError) as err:
            raise InputError(f"{self.model_path}: not a sentencepiece model ({_short(err)})") from None
        self._numpy_out = True

    @property
    def vocab_size(self) -> int:
        return int(self._sp.GetPieceSize())

    @property
    def eod(self) -> int | None:
        eos = int(self._sp.eos_id())
        return None if eos < 0 else eos

    @property
    def bos(self) -> int | None:
        bos = int(self._sp.bos_id())
        return None if bos < 0 else bos

    @property
    def special_tokens(self) -> dict[str, str | None]:
        """{"bos_token", "eos_token", "unk_token", "pad_token"}: each one's piece (`</s>`) or None."""
        ids = {"bos_token": self._sp.bos_id(), "eos_token": self._sp.eos_id(), "unk_token": self._sp.unk_id(),
               "pad_token": self._sp.pad_id()}
        return {name: (self._sp.IdToPiece(int(i)) if i >= 0 else None) for name, i in ids.items()}

    def token_to_id(self, text: str) -> int | None:
        """The id of the piece spelled `text`, or None when no piece is (unknown text is not the unk id)."""
        token = int(self._sp.PieceToId(text))
        if token == self._sp.unk_id() and text != self._sp.IdToPiece(token):
            return None
        return token

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        # One thread per call: parallelism comes from worker processes, one per requested worker.
        return self._sp.Encode(list(texts), out_type=int, num_threads=1)

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode` as int32 arrays. sentencepiece >= 0.2.3 writes them directly (no Python int
        per token: the per-token list-to-array copy was ~7% of preprocessing); older versions
        convert the lists."""
        texts = list(texts)
        out: list[np.ndarray] = []
        # In small batches: a caller's other threads (mf-data preprocess's reader and writer, or
        # multiprocessing's result handler) get a turn every few milliseconds. sentencepiece
        # >= 0.2 releases the GIL inside a batch (two threads encode 1.98x one, measured 0.2.3).
        for k in range(0, len(texts), _ENCODE_BATCH):
            batch = texts[k : k + _ENCODE_BATCH]
            if self._numpy_out:
                try:
                    out.extend(self._sp.Encode(batch, return_type="numpy", num_threads=1))
                    continue
                except (TypeError, ValueError):  # this sentencepiece has no numpy output
                    self._numpy_out = False
            out.extend(np.asarray(ids, dtype=np.int32) for ids in self.encode(batch))
        return out

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.Decode([int(i) for i in ids])

    # Workers receive the path and load their own copy.
    def __getstate__(self) -> str:
        return self.model_path

    def __setstate__(self, state: str) -> None:
        self.__init__(state)  # type: ignore[misc]


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    # sentencepiece prefixes messages with "INTERNAL: file.cc(123) [check] "; keep the sentence.
    return re.sub(r"^.*?\]\s*", "", text) if "]" in text else text


def _training_lines(paths: Sequence[str], json_keys: Sequence[str], stats: dict[str, int]) -> Iterator[str]:
    """Non-empty lines of the documents: sentencepiece skips over-long "sentences", so whole
    documents would mostly be ignored."""
    for doc in iter_documents(paths, json_keys, strict=False, stats=stats):
        for text in doc.values():
            for part in text if isinstance(text, list) else [text]:
                for line in part.splitlines():
                    if line.strip():
                        yield line


def train_sentencepiece(
    inputs: Sequence[str],
    output: str,
    vocab_size: int,
    json_keys: Sequence[str] = ("text",),
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    byte_fallback: bool = False,
    threads: int = 1,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train a model on the json_keys of jsonl corpora; write it atomically to `output`."""
    spm = _spm()
    if vocab_size < 2:
        raise InputError(f"--vocab-size must be at least 2, got {vocab_size}")
    if os.path.exists(output) and not overwrite:
        raise InputError(f"{output}: exists; refusing to overwrite (pass --overwrite)")
    stats: dict[str, int] = {}
    lines = _training_lines(inputs, json_keys, stats)
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.Train(
            sentence_iterator=lines,
            model_writer=buffer,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            num_threads=threads,
            minloglevel=2,
        )
    except RuntimeError as err:
        if not stats.get("documents"):
            raise InputError(f"no training text in {', '.join(inputs)} (every line was blank or bad)") from None
        raise InputError(f"sentencepiece training failed: {_short(err)}") from None
    if not buffer.getvalue():
        raise InputError("sentencepiece training produced no model (is the corpus empty?)")
    atomic_write_bytes(output, buffer.getvalue())
    return {"output": output, "vocab_size": vocab_size, **stats}
