"""A sentencepiece model as a Hugging Face fast tokenizer (`tokenizer.json`) that encodes and decodes
as sentencepiece does, built with the `tokenizers` library from the model's own protobuf.

Why: a directory holding only `tokenizer.model` leaves the conversion to transformers, and each
version converts differently (transformers 5.23's `TokenizersBackend` encodes "The for statement"
as [1131, 26, 59] where sentencepiece gives [20, 26, 59]; 4.x cannot load that class at all). A
`tokenizer.json` is loaded as it is by every version's `PreTrainedTokenizerFast`.

What sentencepiece does, and the `tokenizers` piece that does the same:
- normalizer: the model's precompiled character map (nmt_nfkc turns tabs and newlines into spaces),
  then, with `remove_extra_whitespaces`, leading and trailing spaces dropped and runs of spaces
  made one; the dummy prefix (`add_dummy_prefix`) put before non-empty text only; spaces escaped
  to U+2581. Only the space itself counts as whitespace there, as in sentencepiece's normalizer.
- model: unigram (and char, whose pieces are single characters) as `Unigram` with the model's
  scores (tokenizers' unknown penalty is sentencepiece's: lowest score - 10); BPE as `BPE` whose
  merges are every split of a piece into two pieces, ranked by the merged piece's score (the order
  sentencepiece merges in). Byte fallback and the fusing of consecutive unknowns as in
  sentencepiece. A word model is refused: no `tokenizers` model fuses unknown words as it does.
- added tokens: the unknown and control pieces (`<unk>`, `<s>`, `</s>`) as special tokens, the
  user-defined pieces as ordinary added tokens (sentencepiece matches them whole, as those are).
- decoder: U+2581 back to a space, byte pieces back to their bytes, the unknown piece as the
  model's unknown surface (" ⁇ "), and the dummy prefix's space dropped from the start.
No BOS or EOS is added (mf encodes without them). One difference is inherent to every Hugging Face
tokenizer: the text of a special token written in the input (`</s>`, `<unk>`, `<0x41>` where byte
pieces exist) is read as that token, where sentencepiece spells it out in ordinary pieces.

Needs `tokenizers`, `sentencepiece` (its model's protobuf schema) and `protobuf`: the
`mf-ckpt[hf-tokenizer]` extra. None of them is imported before a sentencepiece model is exported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError

SPACE = "\u2581"
# sentencepiece's ModelProto.SentencePiece.Type and TrainerSpec.ModelType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE, WORD, CHAR = 1, 2, 3, 4
EXTRA = "mf-ckpt[hf-tokenizer]"


@dataclass(frozen=True)
class ExportedTokenizer:
    """tokenizer.json's bytes and what tokenizer_config.json must say beside it."""

    tokenizer_json: bytes
    config: dict[str, Any]


def _libraries(where: str):
    try:
        import tokenizers
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as err:
        raise CheckpointError(
            f"{where}: exporting a sentencepiece tokenizer to Hugging Face needs the tokenizers, sentencepiece and "
            f"protobuf packages ({err}); install them with pip install '{EXTRA}'") from None
    return tokenizers, sentencepiece_model_pb2


def parse_model(data: bytes, where: str):
    """The ModelProto of a sentencepiece model file (refused in one line when it is not one)."""
    _, pb = _libraries(where)
    model = pb.ModelProto()
    try:
        model.ParseFromString(bytes(data))
    except Exception as err:      # protobuf's DecodeError, or a RuntimeWarning-turned-error
        raise CheckpointError(f"{where}: not a sentencepiece model ({type(err).__name__}: {err})") from None
    if not model.pieces:
        raise CheckpointError(f"{where}: not a sentencepiece model (it holds no pieces)")
    return model


def _normalizer(tokenizers, spec):
    from tokenizers import Regex, normalizers

    steps = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    # (tokenizers' regexes are Oniguruma's, where ^ and $ match at every line: \A and \z here)
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex("\\A +"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))   # tokenizers prepends to non-empty text only
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", SPACE))
    if spec.remove_extra_whitespaces:
        # sentencepiece drops trailing spaces after escaping them: a U+2581 written at the end goes too
        steps.append(normalizers.Replace(Regex(f"{SPACE if spec.escape_whitespaces else ' '}+\\z"), ""))
    return normalizers.Sequence(steps)


def _bpe_merges(pieces) -> list[tuple[str, str]]:
    """Every way to make a mergeable piece from two pieces, in sentencepiece's merge order: the
    merged piece with the higher score first (ties: the lower id), then by the parts' ids."""
    ids = {p.piece: i for i, p in enumerate(pieces)}
    mergeable = [(i, p) for i, p in enumerate(pieces) if p.type in (NORMAL, USER_DEFINED)]
    ranked = []
    for i, p in mergeable:
        text = p.piece
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                ranked.append((-p.score, i, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _model(tokenizers, proto, where: str):
    from tokenizers import models

    trainer = proto.trainer_spec
    pieces = list(proto.pieces)
    unk = next((i for i, p in enumerate(pieces) if p.type == UNKNOWN), None)
    if unk is None:
        raise CheckpointError(f"{where}: the sentencepiece model has no unknown piece")
    kind = trainer.model_type or UNIGRAM
    if kind in (UNIGRAM, CHAR):
        return models.Unigram([(p.piece, float(p.score)) for p in pieces], unk, trainer.byte_fallback)
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    if kind == BPE:
        return models.BPE(vocab, _bpe_merges(pieces), unk_token=pieces[unk].piece, fuse_unk=True,
                          byte_fallback=trainer.byte_fallback)
    if kind == WORD:
        # WordLevel would give each unknown word its own <unk>, where sentencepiece fuses a run of them
        raise CheckpointError(f"{where}: a sentencepiece word model has no Hugging Face tokenizer that encodes the "
                              f"same (consecutive unknown words fuse into one unknown piece)")
    raise CheckpointError(f"{where}: sentencepiece model type {kind} is not one of unigram, bpe, char")


def _whole(texts) -> str:
    """A regex matching a token that is exactly one of `texts` (decoders see one token at a time)."""
    import re

    return "\\A(?:" + "|".join(re.escape(t) for t in texts) + ")\\z"


def _decoder(tokenizers, proto):
    from tokenizers import Regex, decoders

    unk = next(p.piece for p in proto.pieces if p.type == UNKNOWN)
    surface = proto.trainer_spec.unk_surface if proto.trainer_spec.HasField("unk_surface") else " \u2047 "
    controls = [p.piece for p in proto.pieces if p.type == CONTROL]
    steps = [decoders.Replace(Regex(_whole([unk])), surface)]
    if controls:                      # sentencepiece decodes a control piece to nothing
        steps.append(decoders.Replace(Regex(_whole(controls)), ""))
    steps += [decoders.ByteFallback(), decoders.Fuse()]
    spec = proto.normalizer_spec
    if spec.remove_extra_whitespaces:
        # sentencepiece drops one leading U+2581 of each piece until some text is out: with pieces
        # holding one U+2581 at most before their text (what such a model makes), all of them
        steps.append(decoders.Replace(Regex(f"\\A{SPACE}+"), ""))
    elif spec.add_dummy_prefix:       # ... and without that rule, only the dummy prefix's
        steps.append(decoders.Replace(Regex(f"\\A{SPACE}"), ""))
    steps.append(decoders.Replace(SPACE, " "))
    return decoders.Sequence(steps)


def sentencepiece_tokenizer_json(data: bytes, where: str) -> ExportedTokenizer:
    """tokenizer.json for the sentencepiece model `data` (see the module docstring), and the
    tokenizer_config.json keys that describe it to transformers."""
    tokenizers, _ = _libraries(where)
    from tokenizers import AddedToken

    proto = parse_model(data, where)
    trainer, spec = proto.trainer_spec, proto.normalizer_spec
    if trainer.treat_whitespace_as_suffix:
        raise CheckpointError(f"{where}: a sentencepiece model with treat_whitespace_as_suffix has no Hugging Face "
                              f"equivalent that encodes the same")
    if proto.denormalizer_spec.precompiled_charsmap:
        raise CheckpointError(f"{where}: a sentencepiece model with a denormalization rule has no Hugging Face "
                              f"equivalent that decodes the same")
    tokenizer = tokenizers.Tokenizer(_model(tokenizers, proto, where))
    tokenizer.normalizer = _normalizer(tokenizers, spec)
    tokenizer.decoder = _decoder(tokenizers, proto)
    special = [AddedToken(p.piece, special=True, normalized=False) for p in proto.pieces if p.type in (UNKNOWN, CONTROL)]
    user = [AddedToken(p.piece, special=False, normalized=True) for p in proto.pieces if p.type == USER_DEFINED]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user)

    def piece(index: int) -> str | None:
        return proto.pieces[index].piece if 0 <= index < len(proto.pieces) else None

    config = {
        # PreTrainedTokenizerFast loads tokenizer.json as it is in every transformers version (4.x and
        # 5.x); a model-specific class (LlamaTokenizerFast) rebuilds the pipeline its own way in 5.x.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        # what sentencepiece does: a space before the text (its dummy prefix), and every stretch of
        # text between special tokens encoded as a sentence of its own (transformers' "legacy")
        "add_prefix_space": bool(spec.add_dummy_prefix), "legacy": True,
        "bos_token": piece(trainer.bos_id), "eos_token": piece(trainer.eos_id), "unk_token": piece(trainer.unk_id),
        "pad_token": piece(trainer.pad_id),
    }
    config = {k: v for k, v in config.items() if v is not None}
    return ExportedTokenizer((tokenizer.to_str(pretty=True) + "\n").encode("utf-8"), config)


def config_bytes(config: dict[str, Any]) -> bytes:
    return (json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
