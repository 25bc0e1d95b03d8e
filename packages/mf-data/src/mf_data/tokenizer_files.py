"""A tokenizer as the files Hugging Face transformers reads: what a checkpoint carries.

`tokenizer_files(path)` returns {file name: bytes}:
- a Hugging Face tokenizer directory (or one holding a sentencepiece `tokenizer.model` with its
  `tokenizer_config.json`): its own tokenizer files, as they are;
- a sentencepiece `.model` file: `tokenizer.model` plus a `tokenizer_config.json` naming its
  special tokens and saying what mf does when it encodes: no BOS or EOS added. Its
  `tokenizer_class` is transformers 5's `TokenizersBackend`, which converts tokenizer.model on load
  (needs the `sentencepiece` and `protobuf` packages) for unigram and BPE models alike; transformers
  5's `LlamaTokenizer` would force a BPE model with its own whitespace rules and encode
  differently. Ordinary text encodes to the same ids as mf-data's SentencePieceTokenizer with the
  newest transformers (tested); transformers 4.x has no `TokenizersBackend` and 5.23 converted
  tokenizer.model differently, so a directory for Hugging Face users is the export (`mf ckpt
  convert --to hf`), which adds a tokenizer.json every version reads as sentencepiece encodes
  (mf-ckpt's sentencepiece_json). Special-token strings written in the text (`</s>`) are matched
  as special tokens by transformers, as by every HF tokenizer.
"""

from __future__ import annotations

import json
import os

from .errors import InputError
from .hf_tokenizer import HFTokenizer
from .sft_encode import load_tokenizer
from .tokenizer import SentencePieceTokenizer

# The files of a tokenizer directory that transformers reads (vocabulary-only formats such as
# vocab.json + merges.txt come with a tokenizer.json in every directory mf-data can load).
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                      "chat_template.jinja", "chat_template.json", "tokenizer.model")


def sentencepiece_tokenizer_config(tokenizer: SentencePieceTokenizer) -> dict:
    """tokenizer_config.json for a sentencepiece model, encoding as mf does (no BOS/EOS added)."""
    sp = tokenizer._sp

    def piece(token_id: int) -> str | None:
        return None if token_id < 0 else sp.IdToPiece(int(token_id))

    config = {"tokenizer_class": "TokenizersBackend", "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "bos_token": piece(sp.bos_id()), "eos_token": piece(sp.eos_id()),
              "unk_token": piece(sp.unk_id())}
    if sp.pad_id() >= 0:
        config["pad_token"] = piece(sp.pad_id())
    return config


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror or err})") from None


def tokenizer_files(path: str | os.PathLike) -> dict[str, bytes]:
    """{file name: bytes} describing the tokenizer at `path` to transformers (see the module
    docstring); the tokenizer is loaded first, so a file mf-data cannot use is refused here."""
    path = os.fspath(path)
    tokenizer = load_tokenizer(path)
    if os.path.isdir(path) and (isinstance(tokenizer, HFTokenizer)
                                or os.path.isfile(os.path.join(path, "tokenizer_config.json"))):
        return {name: _read(os.path.join(path, name)) for name in HF_TOKENIZER_FILES
                if os.path.isfile(os.path.join(path, name))}
    if not isinstance(tokenizer, SentencePieceTokenizer):
        raise InputError(f"{path}: not a tokenizer mf-data can describe to transformers")
    config = json.dumps(sentencepiece_tokenizer_config(tokenizer), indent=2, sort_keys=True) + "\n"
    return {"tokenizer.model": _read(tokenizer.model_path), "tokenizer_config.json": config.encode("utf-8")}
