"""Conversations -> (ids, response mask): exact boundaries with a sentencepiece model (built-in
template) and with a Hugging Face tokenizer (its chat template), the latter checked against the
assistant masks `transformers` computes for the same template."""

from __future__ import annotations

import json
import os

import pytest

from mf_data import (
    ChatEncoder,
    Conversation,
    HFTokenizer,
    InputError,
    SentencePieceTokenizer,
    SFTKeys,
    conversation_from_json,
    load_tokenizer,
)
from mf_data.chat_template import TemplateError
from mf_data.jsonl import LineError

MULTI_TURN = [
    {"role": "system", "content": "You answer questions about the Python language."},
    {"role": "user", "content": "What does the pass statement do?"},
    {"role": "assistant", "content": "Nothing: it is a null operation."},
    {"role": "user", "content": "And the assert statement?"},
    {"role": "assistant", "content": "It inserts debugging assertions into a program."},
]


def test_sentencepiece_builtin_template_boundaries_are_exact(spm_model):
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    conv = Conversation.from_messages(MULTI_TURN)
    ids, mask = ChatEncoder(load_tokenizer(str(spm_model))).encode(conv)
    # The documented built-in template, piece by piece, encoded by sentencepiece itself.
    enc = sp.encode
    want_ids, want_mask = [], []
    for ids_part, trained in [
        (enc("System: You answer questions about the Python language.\n"), 0),
        (enc("User: What does the pass statement do?\n"), 0),
        (enc("Assistant:"), 0),
        (enc(" Nothing: it is a null operation.") + [sp.eos_id()], 1),
        (enc("User: And the assert statement?\n"), 0),
        (enc("Assistant:"), 0),
        (enc(" It inserts debugging assertions into a program.") + [sp.eos_id()], 1),
    ]:
        want_ids += ids_part
        want_mask += [trained] * len(ids_part)
    assert ids == want_ids and mask == want_mask
    replies = [i for i, m in zip(ids, mask) if m]
    assert replies.count(sp.eos_id()) == 2 and ids[-1] == sp.eos_id()  # each reply ends with EOS, trained
    assert sp.decode(replies) == "Nothing: it is a null operation. It inserts debugging assertions into a program."
    assert "pass statement" in sp.decode([i for i, m in zip(ids, mask) if not m])


def test_sentencepiece_weight_zero_and_bos(spm_model):
    tok = load_tokenizer(str(spm_model))
    assert isinstance(tok, SentencePieceTokenizer) and tok.bos == 1 and tok.eod == 2
    messages = [dict(m) for m in MULTI_TURN]
    messages[2]["weight"] = 0
    ids, mask = ChatEncoder(tok, add_bos=True).encode(Conversation.from_messages(messages))
    plain_ids, plain_mask = ChatEncoder(tok).encode(Conversation.from_messages(MULTI_TURN))
    assert ids == [1] + plain_ids and mask[0] == 0
    # The first reply is context now: its tokens keep their ids but leave the loss.
    trained_before = [k for k, m in enumerate(plain_mask) if m]
    trained_now = [k - 1 for k, m in enumerate(mask) if m]
    assert set(trained_now) < set(trained_before)
    assert tok.decode([plain_ids[k] for k in trained_now]) == "It inserts debugging assertions into a program."


def test_hf_chat_template_masks_match_transformers(hf_tokenizer_dirs):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import PreTrainedTokenizerFast

    directory = hf_tokenizer_dirs["chatml"]
    tok = load_tokenizer(str(directory))
    assert isinstance(tok, HFTokenizer) and tok.chat_template is not None
    encoder = ChatEncoder(tok)
    ids, mask = encoder.encode(Conversation.from_messages(MULTI_TURN))

    config = json.loads((directory / "tokenizer_config.json").read_text())
    ref = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), eos_token="<|im_end|>")
    out = ref.apply_chat_template(MULTI_TURN, chat_template=config["chat_template"], tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=True)
    assert ids == list(out["input_ids"])
    assert mask == list(out["assistant_masks"])
    im_end = tok._tok.token_to_id("<|im_end|>")
    replies = [i for i, m in zip(ids, mask) if m]
    assert replies.count(im_end) == 2  # the end-of-turn token closing each reply is trained
    assert "<|im_start|>" not in tok.decode(replies) and "pass statement" not in tok.decode(replies)

    # The generation prompt is tokenised exactly as the training context before the first reply.
    prompt = encoder.encode_prompt(MULTI_TURN[:2])
    assert prompt == ids[: mask.index(1)]
    assert prompt == list(ref.apply_chat_template(MULTI_TURN[:2], chat_template=config["chat_template"], tokenize=True,
                                                  add_generation_prompt=True, return_dict=True)["input_ids"])


def test_hf_without_template_uses_builtin(hf_tokenizer_dirs):
    tok = load_tokenizer(str(hf_tokenizer_dirs["plain"]))
    encoder = ChatEncoder(tok)
    assert tok.chat_template is None and encoder.template == "builtin"
    eos = tok._tok.token_to_id("<|endoftext|>")
    assert tok.eod == eos
    conv = conversation_from_json({"prompt": "What does the pass statement do?", "response": "Nothing at all."})
    ids, mask = encoder.encode(conv)
    raw = tok._tok
    pieces = [("User: What does the pass statement do?\n", 0), ("Assistant:", 0), (" Nothing at all.", 1)]
    want = [(i, m) for text, m in pieces for i in raw.encode(text, add_special_tokens=False).ids] + [(eos, 1)]
    assert list(zip(ids, mask)) == want
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == " Nothing at all.<|endoftext|>"
    with pytest.raises(InputError, match="built-in template only"):
        ChatEncoder(load_tokenizer(str(hf_tokenizer_dirs["chatml"])), add_bos=True)
    # --builtin-template: the chat template is set aside.
    assert ChatEncoder(load_tokenizer(str(hf_tokenizer_dirs["chatml"])), use_template=False).template == "builtin"


def _hf_dir_with_template(tmp_path, source, base):
    d = tmp_path / "tpl"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((base / "tokenizer.json").read_bytes())
    (d / "chat_template.jinja").write_text(source)  # takes precedence over tokenizer_config.json
    return d


def test_template_that_is_not_prefix_stable_is_refused(tmp_path, hf_tokenizer_dirs):
    # Renders earlier replies differently (as templates that strip past reasoning do).
    source = ("{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' and not loop.last %}[earlier reply]"
              "{% else %}{{ m.content }}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    d = _hf_dir_with_template(tmp_path, source, hf_tokenizer_dirs["chatml"])
    encoder = ChatEncoder(load_tokenizer(str(d)))
    assert encoder.template.endswith("chat_template.jinja")
    single = Conversation.from_messages(MULTI_TURN[1:3])
    ids, mask = encoder.encode(single)  # one turn is fine
    # trim_blocks (as transformers renders) eats the newline after {% endif %}.
    assert encoder.tokenizer.decode([i for i, m in zip(ids, mask) if m]) == "Nothing: it is a null operation."
    with pytest.raises(TemplateError, match="not prefix-stable"):
        encoder.encode(Conversation.from_messages(MULTI_TURN))


def test_template_errors_become_line_errors(tmp_path, hf_tokenizer_dirs):
    source = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 is even) %}"
              "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}{{ m.content }}{% endfor %}")
    d = _hf_dir_with_template(tmp_path, source, hf_tokenizer_dirs["chatml"])
    encoder = ChatEncoder(load_tokenizer(str(d)))
    with pytest.raises(LineError, match="roles must alternate"):
        encoder.encode(Conversation.from_messages(MULTI_TURN))  # starts with a system message
    (d / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(InputError, match="chat template does not parse"):
        ChatEncoder(load_tokenizer(str(d)))


@pytest.mark.parametrize(
    "obj, message",
    [
        ([1, 2], "expected a JSON object"),
        ({"text": "x"}, "neither 'messages' nor 'prompt'/'response'"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "must end with an assistant message"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "role 'bot'"),
        ({"messages": [{"role": "user", "content": ["a"]}, {"role": "assistant", "content": "b"}]}, "content is list"),
        ({"messages": [{"role": "user", "content": "a", "name": "x"}, {"role": "assistant", "content": "b"}]}, "unsupported key 'name'"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "s"}, {"role": "assistant", "content": "b"}]}, "may only come first"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 0}]}, "no assistant message to train on"),
        ({"messages": [{"role": "user", "content": "a", "weight": 1}, {"role": "assistant", "content": "b"}]}, "only assistant messages are weighted"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 0.5}]}, "weight must be 0 or 1"),
        ({"prompt": "a"}, "missing key 'response'"),
        ({"prompt": "a", "response": 3}, "key 'response' holds int"),
        ({"prompt": "a", "response": "b", "messages": []}, "ambiguous"),
    ],
)
def test_bad_records(obj, message):
    with pytest.raises(LineError, match=message):
        conversation_from_json(obj)


def test_configurable_keys_and_system_field():
    keys = SFTKeys(messages="conv", prompt="question", response="answer", system="sys")
    conv = conversation_from_json({"question": "q", "answer": "a", "sys": "s"}, keys)
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant"] and conv.trained == (False, False, True)
    conv = conversation_from_json({"conv": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, keys)
    assert conv.messages[1] == {"role": "assistant", "content": "a"}


def test_tokenizer_loading_errors(tmp_path):
    with pytest.raises(InputError, match="tokenizer not found"):
        load_tokenizer(str(tmp_path / "absent"))
    with pytest.raises(InputError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(InputError, match="not a tokenizers file"):
        load_tokenizer(str(tmp_path))
