"""Special tokens by name and ids by text, on both tokenizers (what `mf serve`'s /tokenizer_info and
/tokenize read): the sentencepiece model's own control pieces, the HF directory's configured tokens."""

from __future__ import annotations

import sentencepiece

from mf_data import SentencePieceTokenizer, load_tokenizer


def test_sentencepiece_special_tokens_and_ids(spm_model):
    tok = SentencePieceTokenizer(str(spm_model))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    specials = tok.special_tokens
    assert specials["eos_token"] == sp.id_to_piece(sp.eos_id()) and specials["bos_token"] == sp.id_to_piece(sp.bos_id())
    assert specials["unk_token"] == sp.id_to_piece(sp.unk_id())
    assert specials["pad_token"] is None if sp.pad_id() < 0 else specials["pad_token"] == sp.id_to_piece(sp.pad_id())
    assert tok.token_to_id(specials["eos_token"]) == tok.eod and tok.token_to_id(specials["bos_token"]) == tok.bos
    assert tok.token_to_id(specials["unk_token"]) == sp.unk_id()
    assert tok.token_to_id("no such piece here") is None and tok.chat_template is None


def test_hf_tokenizer_token_to_id(hf_tokenizer_dirs):
    tok = load_tokenizer(str(hf_tokenizer_dirs["chatml"]))
    eos = tok.special_tokens["eos_token"]
    assert eos and tok.token_to_id(eos) == tok.eod
    assert tok.token_to_id("no such token here") is None
