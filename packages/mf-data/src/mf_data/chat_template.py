"""Chat templates, and cutting a rendered conversation into prompt and response pieces.

A Hugging Face tokenizer's `chat_template` (jinja) is rendered the way `transformers` renders it:
a sandboxed environment with `trim_blocks` and `lstrip_blocks`, the loop-controls extension,
`raise_exception(msg)`, a `tojson` filter that keeps non-ASCII text, `strftime_now(fmt)` (frozen
at the time the process started, so every rendering of a run agrees), the tokenizer's special
tokens (`bos_token`, `eos_token`, ...) as variables, and `{% generation %}` blocks rendered as
their plain contents.

Where the loss goes is found by rendering incrementally. For the assistant message k:

    prompt_k = render(messages[:k], add_generation_prompt=True)    # what a generator is given
    upto_k   = render(messages[:k + 1])                            # ... plus the reply
    full     = render(messages)

Both must be prefixes of what follows (`prompt_k` of `upto_k`, `upto_k` of `full`); then
`full[len(prompt_k):len(upto_k)]` is exactly the text the model produced for turn k, including
whatever the template closes the turn with (an end-of-turn or EOS token). A template that renders
an earlier turn differently once more messages follow (some strip reasoning from past turns)
cannot be cut exactly: such a conversation is a bad line saying so, never a guessed mask.

The pieces are then tokenised one by one (`mf_data.sft_encode`), so the mask boundaries fall
exactly between tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from .errors import InputError
from .jsonl import LineError

Renderer = Callable[[Sequence[dict[str, str]], bool], str]
_STARTED = datetime.now()


class TemplateError(LineError):
    """The chat template failed on, or cannot be cut exactly for, one conversation."""


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TemplateError(f"chat template: {message}")


def compile_template(source: str, special_tokens: dict[str, str | None], origin: str) -> Renderer:
    """A function `render(messages, add_generation_prompt) -> str` for jinja `source`."""
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise InputError(f"{origin}: rendering its chat template needs jinja2: pip install 'mf-data[hf]'") from None

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text for transformers'
        assistant masks; the masks here come from incremental rendering, so render the body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> list[nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _STARTED.strftime
    try:
        template = env.from_string(source)
    except jinja2.TemplateSyntaxError as err:
        raise InputError(f"{origin}: chat template does not parse: {err.message} (line {err.lineno})") from None
    tokens = {k: v for k, v in special_tokens.items() if v is not None}

    def render(messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        try:
            return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt, **tokens)
        except TemplateError:
            raise
        except Exception as err:  # jinja raises anything the template's expressions raise
            raise TemplateError(f"chat template failed: {type(err).__name__}: {err}") from None

    return render


def split_rendered(render: Renderer, messages: Sequence[dict[str, str]], trained: Sequence[bool],
                   add_generation_prompt: bool = False) -> list[tuple[str, bool]]:
    """The rendered conversation as consecutive (text, trained) pieces (see the module docstring).

    With `add_generation_prompt` the last piece is the generation prompt (for generation, where
    nothing is trained)."""
    full = render(messages, False)
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render(messages[:k], True)
        upto = render(messages[: k + 1], False)
        if not upto.startswith(prompt):
            raise TemplateError(
                f"chat template: the text up to assistant message {k} does not start with its generation "
                "prompt, so the reply cannot be located exactly"
            )
        if not full.startswith(upto) or len(prompt) < pos:
            raise TemplateError(
                f"chat template renders assistant message {k} differently once later messages follow "
                "(not prefix-stable), so its loss mask cannot be placed exactly; give one conversation per turn"
            )
        if len(prompt) > pos:
            pieces.append((full[pos : len(prompt)], False))
        pieces.append((full[len(prompt) : len(upto)], bool(trained[k])))
        pos = len(upto)
    tail = render(messages, True) if add_generation_prompt else full
    if not tail.startswith(full[:pos]):
        raise TemplateError("chat template: the generation prompt does not extend the rendered conversation")
    if len(tail) > pos:
        pieces.append((tail[pos:], False))
    return pieces


# --- the built-in template ----------------------------------------------------------------------
BUILTIN_TEMPLATE_DOC = """\
[BOS]                      only with add_bos
System: {content}\\n        each system message      (prompt)
User: {content}\\n          each user message        (prompt)
Assistant:                 before each reply        (prompt; also the generation prompt)
 {content}[EOS]            each assistant message   (trained, EOS included, unless weight 0)"""


def builtin_pieces(messages: Sequence[dict[str, str]], trained: Sequence[bool], eos: int, bos: int | None,
                   add_generation_prompt: bool = False) -> list[tuple[str | list[int], bool]]:
    """The built-in template as pieces: text to tokenise, or token ids (BOS, EOS) as they are."""
    pieces: list[tuple[str | list[int], bool]] = []
    if bos is not None:
        pieces.append(([bos], False))
    for message, train in zip(messages, trained):
        role, content = message["role"], message["content"]
        if role == "assistant":
            pieces.append(("Assistant:", False))
            pieces.append((" " + content, bool(train)))
            pieces.append(([eos], bool(train)))
        else:
            pieces.append((f"{role.capitalize()}: {content}\n", False))
    if add_generation_prompt:
        pieces.append(("Assistant:", False))
    return pieces
