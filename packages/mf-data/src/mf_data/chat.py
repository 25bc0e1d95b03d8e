"""Supervised (SFT) records: one jsonl line -> one validated conversation.

Two shapes are accepted per line (key names configurable through `SFTKeys`):

* `{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}` - OpenAI's
  chat format. An assistant message may carry `"weight": 0` (OpenAI's fine-tuning convention)
  to keep it as context without training on it; `1` (the default) trains on it.
* `{"prompt": "...", "response": "..."}`, optionally with `"system": "..."` - one user turn and
  its answer.

Rules (a line breaking one is a bad line, reported with its reason): the messages key holds a
non-empty list; every message is an object with a known role and a string content and no other
keys (a field we would not honour is refused, not dropped); a system message may only come
first; the conversation ends with an assistant message (later turns could never be trained on)
and at least one assistant message has weight 1. A line with both shapes is ambiguous and bad.
"""

from __future__ import annotations

from dataclasses import dataclass

from .jsonl import LineError

ROLES = ("system", "user", "assistant")
_MESSAGE_KEYS = ("role", "content", "weight")


@dataclass(frozen=True)
class SFTKeys:
    """Names of the fields that hold a conversation in a jsonl line."""

    messages: str = "messages"
    prompt: str = "prompt"
    response: str = "response"
    system: str = "system"


@dataclass(frozen=True)
class Conversation:
    """`messages` as chat templates expect them (`{"role", "content"}` dicts) and, per message,
    whether its tokens are trained on (assistant messages of weight 1)."""

    messages: tuple[dict[str, str], ...]
    trained: tuple[bool, ...]

    @classmethod
    def from_messages(cls, messages: list[dict]) -> Conversation:
        """Validate a list of messages (same rules as a `messages` line)."""
        parsed = [_message(m, i) for i, m in enumerate(messages)]
        return _checked([m for m, _ in parsed], [t for _, t in parsed], require_answer=True)


def _message(raw: object, index: int) -> tuple[dict[str, str], bool]:
    where = f"message {index}"
    if not isinstance(raw, dict):
        raise LineError(f"{where} is {type(raw).__name__}, expected an object with role and content")
    extra = [k for k in raw if k not in _MESSAGE_KEYS]
    if extra:
        raise LineError(f"{where} has unsupported key {extra[0]!r} (only role, content, weight)")
    role = raw.get("role")
    if role not in ROLES:
        raise LineError(f"{where} has role {role!r}, expected one of {', '.join(ROLES)}")
    content = raw.get("content")
    if not isinstance(content, str):
        raise LineError(f"{where} ({role}) content is {type(content).__name__}, expected a string")
    weight = raw.get("weight", 1)
    if "weight" in raw:
        if role != "assistant":
            raise LineError(f"{where} ({role}) has a weight; only assistant messages are weighted")
        if isinstance(weight, bool) or weight not in (0, 1):
            raise LineError(f"{where} weight must be 0 or 1, got {weight!r}")
    return {"role": role, "content": content}, role == "assistant" and weight == 1


def _checked(messages: list[dict[str, str]], trained: list[bool], require_answer: bool) -> Conversation:
    for i, m in enumerate(messages):
        if m["role"] == "system" and i > 0:
            raise LineError(f"message {i} is a system message; a system message may only come first")
    if require_answer:
        if not messages or messages[-1]["role"] != "assistant":
            raise LineError("the conversation must end with an assistant message (later turns are never trained on)")
        if not any(trained):
            raise LineError("no assistant message to train on (every one has weight 0)")
    return Conversation(tuple(messages), tuple(trained))


def conversation_from_json(obj: object, keys: SFTKeys = SFTKeys()) -> Conversation:
    """The conversation one parsed jsonl line holds; `LineError` says why a line is unusable."""
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {type(obj).__name__}")
    has_messages = keys.messages in obj
    has_pair = keys.prompt in obj or keys.response in obj
    if has_messages and has_pair:
        raise LineError(f"both {keys.messages!r} and {keys.prompt!r}/{keys.response!r}: ambiguous, give one")
    if has_messages:
        raw = obj[keys.messages]
        if not isinstance(raw, list) or not raw:
            raise LineError(f"key {keys.messages!r} must hold a non-empty list of messages")
        parsed = [_message(m, i) for i, m in enumerate(raw)]
        return _checked([m for m, _ in parsed], [t for _, t in parsed], require_answer=True)
    if not has_pair:
        raise LineError(f"neither {keys.messages!r} nor {keys.prompt!r}/{keys.response!r}")
    messages: list[dict[str, str]] = []
    for key, role in ((keys.system, "system"), (keys.prompt, "user"), (keys.response, "assistant")):
        if key not in obj:
            if role == "system":
                continue
            raise LineError(f"missing key {key!r}")
        value = obj[key]
        if not isinstance(value, str):
            raise LineError(f"key {key!r} holds {type(value).__name__}, expected a string")
        messages.append({"role": role, "content": value})
    return _checked(messages, [m["role"] == "assistant" for m in messages], require_answer=True)


def prompt_conversation(messages: list[dict]) -> Conversation:
    """Messages to generate a reply to (any last role; nothing is trained on)."""
    parsed = [_message(m, i) for i, m in enumerate(messages)]
    if not parsed:
        raise LineError("no messages")
    return _checked([m for m, _ in parsed], [False] * len(parsed), require_answer=False)
