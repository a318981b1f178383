"""The record layouts orch reads, each as the tool that writes it reads it: one record (a JSONL line, a JSON list
element, a parquet row) to its turns, media files and tool definitions. Torch-free.

Found by their keys (`Layout()`), or named by LLaMA-Factory's dataset description (`formatting`, `columns`,
`tags`: runtime/data/dataset_info.py):

* `messages`: a list of turns, each `{role, content}` (LLaMA-Factory's sharegpt with its role/content tags, the
  OpenAI / Hugging Face layout) or `{from, value}`;
* `conversations`: ShareGPT, each turn `{from, value}` (or `{role, content}`);
* `conversation`: ms-swift's list of `{human, assistant}` pairs (a `system` in the record);
* `query` / `response` (ms-swift) and `instruction` / `input` / `output` (alpaca), with `history` (a list of
  [query, response] pairs before them) and `system`.

Roles: user / human, assistant / gpt, system, function_call / tool_call (ms-swift's) (a tool call: its content the
call's JSON, `{"name", "arguments"}` or a list of them; an OpenAI assistant turn's `tool_calls` is read as one),
observation / tool / tool_response (ms-swift's) / function (a tool's answer). A first turn of role system, else
the record's `system`, is the system prompt. A conversation that opens with the assistant's turn (after its
system prompt) is refused, as LLaMA-Factory's converter drops it. `tools` (a list of function definitions, or its
JSON text) is passed to the chat template as `tools`.

A turn's content is a string (its `<image>`, `<video>` and `<audio>` placeholders standing for the next file of
the record's `images`, `videos`, `audios`: paths, or ms-swift's `{"path": ...}` objects), or a list of typed
parts: `{"type": "text", "text": ...}`, and `{"type": "image", "image": PATH}` / `{"type": "image_url",
"image_url": {"url": PATH}}` (or `"value"`, as in LLaMA-Factory's v1_multimodal_demo.jsonl), the same for
`audio` / `audio_url` / `input_audio` and `video` / `video_url`: each media part becomes its placeholder where it
stands, and its file the next of its list. A media
part without a path is a placeholder for the next file of the record's list.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from orch.runtime.sample import AUDIO, IMAGE, VIDEO

TRAINED_ROLES = ("assistant", "function_call")  # the turns whose tokens train (LLaMA-Factory's)
MEDIA_KEYS = {"images": IMAGE, "videos": VIDEO, "audios": AUDIO}
ACCEPTED = (
    "messages or conversations (turns of role/content or from/value), conversation ({human, assistant} pairs), "
    "query/response, or instruction/output"
)
# every role name a layout may use, as orch keeps it
ROLES = {
    "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system",
    "function_call": "function_call", "tool_call": "function_call", "observation": "tool", "tool": "tool",
    "tool_response": "tool", "function": "tool",
}  # fmt: skip
_PART_KINDS = {
    "image": IMAGE, "image_url": IMAGE, "video": VIDEO, "video_url": VIDEO, "audio": AUDIO, "audio_url": AUDIO,
    "input_audio": AUDIO,
}  # fmt: skip
_TAG_ROLES = (("user_tag", "user"), ("assistant_tag", "assistant"), ("observation_tag", "tool"),
              ("function_tag", "function_call"), ("system_tag", "system"))  # fmt: skip
_KEY_OF = {IMAGE: "images", VIDEO: "videos", AUDIO: "audios"}


@dataclass(frozen=True)
class Layout:
    """How a record names its fields: `formatting` (auto: by its keys; alpaca, sharegpt or openai: LLaMA-Factory's)
    and LLaMA-Factory's `columns` (orch's name -> the record's key) and `tags` (role and content keys, role
    names). JSON values: it keys the index."""

    formatting: str = "auto"
    columns: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()

    def column(self, name: str, default: str | None) -> str | None:
        return dict(self.columns).get(name, default)

    def as_json(self) -> dict[str, Any]:
        return {"formatting": self.formatting, "columns": dict(self.columns), "tags": dict(self.tags)}

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> Layout:
        if not raw:
            return cls()
        return cls(raw.get("formatting", "auto"), tuple(sorted(raw.get("columns", {}).items())),
                   tuple(sorted(raw.get("tags", {}).items())))  # fmt: skip


@dataclass
class Record:
    """One record read: its turns (role, content with placeholders), its media paths by key in placeholder order,
    and its tool definitions (JSON text, "" where none)."""

    turns: list[tuple[str, str]]
    media: dict[str, list[str]] = field(default_factory=dict)
    tools: str = ""


class LayoutError(ValueError):
    """What is wrong with a record (the field and what was expected)."""


def read_record(raw: Any, layout: Layout) -> Record:
    """`raw` in `layout` (module docstring); LayoutError saying which field is wrong and what was expected."""
    if not isinstance(raw, dict):
        raise LayoutError(f"expected an object with {ACCEPTED}")
    fmt = layout.formatting
    if fmt == "auto":
        turns, system = _auto_turns(raw)
    elif fmt == "alpaca":
        turns, system = _pairs_turns(raw, layout, "instruction", "input", "output")
    else:  # sharegpt, openai
        key = layout.column("messages", "conversations") or "conversations"
        turns, system = _list_turns(raw, key, dict(layout.tags))
    system_key = layout.column("system", "system")
    if system is None and system_key is not None and raw.get(system_key) not in (None, ""):
        system = raw[system_key]
        if not isinstance(system, str):
            raise LayoutError(f"{system_key}: expected a string (the system prompt)")
    media: dict[str, list[str]] = {}
    for key in MEDIA_KEYS:
        column = layout.column(key, key) or key
        files = raw.get(column)
        if files in (None, ""):
            files = []
        if isinstance(files, str):
            files = [files]
        if isinstance(files, list):  # ms-swift's {"path": ...} entries
            files = [f.get("path") if isinstance(f, dict) else f for f in files]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise LayoutError(f"{column}: expected a list of file paths (or of {{path}} objects)")
        media[key] = list(files)
    out: list[tuple[str, str]] = [("system", system)] if system else []
    parted = {key: 0 for key in MEDIA_KEYS}  # media parts with a path, per key
    listed = {key: len(files) for key, files in media.items()}
    for i, (role, content) in enumerate(turns):
        if isinstance(content, list):
            content = _parts(content, f"messages[{i}].content", media, parted, listed)
        out.append((role, content))
    for key, n in parted.items():
        if n and listed[key]:
            raise LayoutError(f"{key}: files both in content parts and in the {key} list (name them in one place)")
    return Record(out, media, _tools(raw, layout.column("tools", "tools")))


def _auto_turns(raw: dict[str, Any]) -> tuple[list[tuple[str, Any]], str | None]:
    if "messages" in raw:
        return _list_turns(raw, "messages", {})
    if "conversations" in raw:
        return _list_turns(raw, "conversations", {})
    if "conversation" in raw:
        return _swift_pairs(raw)
    if "query" in raw or "response" in raw:
        return _pairs_turns(raw, Layout(), "query", None, "response")
    if "instruction" in raw or "output" in raw:
        return _pairs_turns(raw, Layout(), "instruction", "input", "output")
    raise LayoutError(f"no conversation: expected {ACCEPTED}; the record has {', '.join(sorted(raw)) or 'no keys'}")


def _list_turns(raw: dict[str, Any], key: str, tags: dict[str, str]) -> tuple[list[tuple[str, Any]], str | None]:
    """A list of turn objects: role/content or from/value (or the dataset description's tags)."""
    turns = raw.get(key)
    if not isinstance(turns, list) or not turns:
        raise LayoutError(f"{key}: expected a non-empty list of turns ({{role, content}} or {{from, value}})")
    names = {tags[t]: role for t, role in _TAG_ROLES if t in tags}
    out: list[tuple[str, Any]] = []
    named: list[str] = []  # each turn's role as the record writes it (`from: 'gpt'`)
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise LayoutError(f"{key}[{i}]: expected an object with role and content (or from and value)")
        role_key = tags.get("role_tag") or ("role" if "role" in turn else "from")
        content_key = tags.get("content_tag") or ("content" if "content" in turn or role_key == "role" else "value")
        name = turn.get(role_key)
        role = names.get(name) if isinstance(name, str) and name in names else ROLES.get(name)  # type: ignore[arg-type]
        if role is None:
            accepted = ", ".join(dict.fromkeys([*names, *ROLES]))
            raise LayoutError(f"{key}[{i}].{role_key}: expected one of {accepted}, got {name!r}")
        named.append(f"{role_key}: {name!r}")
        content = turn.get(content_key)
        calls = turn.get("tool_calls")
        if role == "assistant" and calls:  # OpenAI: an assistant turn calling tools is a function_call turn
            role, content = "function_call", _calls_text(calls, f"{key}[{i}].tool_calls")
        if content is None and role in TRAINED_ROLES:
            content = ""
        if not isinstance(content, (str, list)):
            raise LayoutError(f"{key}[{i}].{content_key}: expected a string or a list of typed parts")
        out.append((role, content))
    opening = 1 if out and out[0][0] == "system" else 0
    if len(out) > opening and out[opening][0] in TRAINED_ROLES:  # LLaMA-Factory's converter drops it too
        raise LayoutError(f"{key}[{opening}]: the conversation opens with the assistant's turn ({named[opening]}): "
                          "expected a user turn first")  # fmt: skip
    system = None
    if opening:
        content = out.pop(0)[1]
        if not isinstance(content, str):
            content = "".join(p.get("text") or p.get("value") or "" for p in content if isinstance(p, dict))
        system = content
    return out, system


def _swift_pairs(raw: dict[str, Any]) -> tuple[list[tuple[str, Any]], str | None]:
    pairs = raw["conversation"]
    if not isinstance(pairs, list) or not pairs:
        raise LayoutError("conversation: expected a non-empty list of {human, assistant}")
    out: list[tuple[str, Any]] = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, dict) or not isinstance(pair.get("human"), str):
            raise LayoutError(f"conversation[{i}]: expected an object with human and assistant strings")
        out.append(("user", pair["human"]))
        if isinstance(pair.get("assistant"), str):
            out.append(("assistant", pair["assistant"]))
    return out, None


def _pairs_turns(
    raw: dict[str, Any], layout: Layout, prompt: str, query: str | None, response: str
) -> tuple[list[tuple[str, Any]], str | None]:
    """alpaca (instruction, input, output) or ms-swift (query, response), after `history`'s pairs."""
    prompt_key = layout.column("prompt", prompt) or prompt
    query_key = layout.column("query", query) if query else None
    response_key = layout.column("response", response) or response
    history_key = layout.column("history", "history") or "history"
    out: list[tuple[str, Any]] = []
    history = raw.get(history_key) or []
    if not isinstance(history, list):
        raise LayoutError(f"{history_key}: expected a list of [query, response] pairs")
    for i, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise LayoutError(f"{history_key}[{i}]: expected a [query, response] pair of strings")
        out += [("user", pair[0]), ("assistant", pair[1])]
    ask = raw.get(prompt_key)
    if not isinstance(ask, str):
        raise LayoutError(f"{prompt_key}: expected a string")
    extra = raw.get(query_key) if query_key else None
    if extra not in (None, ""):
        if not isinstance(extra, str):
            raise LayoutError(f"{query_key}: expected a string")
        ask = f"{ask}\n{extra}" if ask else extra
    answer = raw.get(response_key)
    if not isinstance(answer, str):
        raise LayoutError(f"{response_key}: expected a string")
    return [*out, ("user", ask), ("assistant", answer)], None


def _parts(parts: list[Any], where: str, media: dict[str, list[str]], parted: dict[str, int],
           listed: dict[str, int]) -> str:  # fmt: skip
    """Typed content parts as one string: text as it is, each media part its placeholder (its path, where it names
    one, appended to its list)."""
    text = []
    for j, part in enumerate(parts):
        if isinstance(part, str):
            text.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            value = part.get("text", part.get("value"))
            if not isinstance(value, str):
                raise LayoutError(f"{where}[{j}].text: expected a string")
            text.append(value)
            continue
        tag = _PART_KINDS.get(kind) if isinstance(kind, str) else None
        if tag is None:
            raise LayoutError(f"{where}[{j}].type: expected text, image, image_url, audio, audio_url, video or "
                              f"video_url, got {kind!r}")  # fmt: skip
        assert isinstance(part, dict)
        path = next((part[k] for k in (kind, "value", "url", "path") if part.get(k) not in (None, "")), None)
        if isinstance(path, dict):
            path = path.get("url") or path.get("path")
        if path is not None:
            if not isinstance(path, str):
                raise LayoutError(f"{where}[{j}].{kind}: expected a file path")
            key = _KEY_OF[tag]
            media[key].append(path.removeprefix("file://"))
            parted[key] += 1
        text.append(tag)
    return "".join(text)


def _calls_text(calls: Any, where: str) -> str:
    """An OpenAI `tool_calls` list as a function_call turn's content: the JSON list of {name, arguments}."""
    if not isinstance(calls, list):
        raise LayoutError(f"{where}: expected a list of calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise LayoutError(f"{where}[{j}]: expected {{function: {{name, arguments}}}}")
        out.append({"name": fn["name"], "arguments": fn.get("arguments", {})})
    return json.dumps(out, ensure_ascii=False)


def _tools(raw: dict[str, Any], key: str | None) -> str:
    value = raw.get(key) if key else None
    if value in (None, "", []):
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise LayoutError(f"{key}: expected a list of tool definitions (or its JSON text)") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise LayoutError(f"{key}: expected a list of tool definitions (or its JSON text)")
    return json.dumps(value, ensure_ascii=False)


def tool_calls(content: str) -> list[dict[str, Any]] | None:
    """A function_call turn's calls in the chat template's form (`{"type": "function", "function": {"name",
    "arguments"}}`, arguments an object where their JSON text is one); None where the content is no call."""
    try:
        value = json.loads(content)
    except json.JSONDecodeError:
        return None
    calls = value if isinstance(value, list) else [value]
    out = []
    for c in calls:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            return None
        args = c.get("arguments", {})
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):  # arguments that are no JSON stay text
                args = json.loads(args)
        out.append({"type": "function", "function": {"name": c["name"], "arguments": args}})
    return out
