"""Tools as plain Python functions: their JSON schema, the model's calls parsed, called and answered.

A tool is a function whose type hints and docstring say how it is called::

    def lookup(key: str, exact: bool = True) -> str:
        '''Read one value from the table.

        Args:
            key: the key to read.
            exact: match the key exactly.
        '''

:func:`tool_schema` gives the OpenAI-style schema chat templates render (Qwen's lists it in
the system turn when ``apply_chat_template(..., tools=schemas)``)::

    {"type": "function", "function": {"name": "lookup", "description": "Read one value from the table.",
     "parameters": {"type": "object", "properties": {"key": {"type": "string", "description": ...}, ...},
                    "required": ["key"]}}}

Types: ``str``, ``int``, ``float``, ``bool``, ``list[X]``, ``dict``, ``X | None`` / ``Optional[X]``
(``"nullable": true``) and ``Literal[...]`` (``"enum"``); parameter descriptions from a Google
``Args:`` section or reST ``:param name:`` lines; required = the parameters without a default.
The same rules as ``transformers.utils.get_json_schema``, without importing transformers.

The model calls tools in its chat template's format, Qwen's (the built-in models')::

    <tool_call>
    {"name": "lookup", "arguments": {"key": "k7"}}
    </tool_call>

several per turn.  :func:`parse_tool_calls` reads them (a malformed one is a call with an
``error``, never an exception); :func:`call_tool` checks the arguments against the schema and
calls the function, and every outcome, a failure included, is a ``{"role": "tool", "content":
...}`` message for the model (Qwen's template renders it as ``<tool_response>``).
:class:`ToolEnvironment` makes an environment (``algo/environment.py``) of tools and a scorer.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union


class ToolSchemaError(TypeError):
    """A function whose signature cannot be described as a tool (one line naming it)."""


_PRIMITIVES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _type_schema(tp: Any, where: str) -> dict:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            return {**_type_schema(rest[0], where), "nullable": True}
        raise ToolSchemaError(f"{where}: a union {tp} is not supported (only X | None)")
    if origin is Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _PRIMITIVES:
            raise ToolSchemaError(f"{where}: Literal{list(args)} must hold values of one of str, int, float, bool")
        return {"type": _PRIMITIVES[next(iter(kinds))], "enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0], where)} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    raise ToolSchemaError(f"{where}: type {getattr(tp, '__name__', tp)} is not supported; allowed: str, int, "
                          "float, bool, list[...], dict, X | None, Literal[...]")


_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")
_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_REST_PARAM = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google- or reST-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section, current = None, None
    for line in lines:
        head = _SECTION.match(line)
        rest = _REST_PARAM.match(line)
        if rest:
            section, current = "rest", rest.group(1)
            params[current] = rest.group(2).strip()
        elif line.strip().startswith(":"):  # :returns:, :type x:, ...
            section, current = "rest-other", None
        elif head:
            section, current = head.group(1), None
        elif section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            arg = _GOOGLE_ARG.match(line)
            indent = len(line) - len(line.lstrip())
            if arg and indent <= 4:
                current = arg.group(1).lstrip("*")
                params[current] = arg.group(3).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
        elif section == "rest" and current and line.strip():
            params[current] = (params[current] + " " + line.strip()).strip()
    text = " ".join(" ".join(description).split())
    return text, params


def tool_schema(fn: Callable) -> dict:
    """The OpenAI-style schema of ``fn`` (the module doc gives the rules)."""
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
    except (NameError, TypeError, ValueError) as e:
        raise ToolSchemaError(f"tool {name}: cannot read its signature ({e})") from None
    description, docs = parse_docstring(inspect.getdoc(fn))
    properties, required = {}, []
    for p in sig.parameters.values():
        where = f"tool {name}, parameter {p.name}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolSchemaError(f"{where}: *args / **kwargs cannot be described; name every parameter")
        if p.name not in hints:
            raise ToolSchemaError(f"{where}: no type hint (the schema is read from the hints)")
        prop = _type_schema(hints[p.name], where)
        if p.name in docs:
            prop["description"] = docs[p.name]
        properties[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


@dataclass(frozen=True)
class Tool:
    """A function with its schema."""

    fn: Callable
    schema: dict

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @classmethod
    def of(cls, fn: Callable) -> Tool:
        return cls(fn, tool_schema(fn))


def tool_set(fns: list[Callable]) -> dict[str, Tool]:
    """Tools by name; two with one name is a :class:`ToolSchemaError`."""
    tools: dict[str, Tool] = {}
    for fn in fns:
        tool = Tool.of(fn)
        if tool.name in tools:
            raise ToolSchemaError(f"two tools named {tool.name!r}")
        tools[tool.name] = tool
    return tools


# -- the model's calls -------------------------------------------------------------------------
_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block: a name and arguments, or what was wrong with it (``error``)."""

    name: str
    arguments: dict
    error: str = ""
    raw: str = ""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order (an unclosed last one too)."""
    calls = []
    for match in _CALL.finditer(text):
        raw, closed = match.group(1).strip(), bool(match.group(2))
        calls.append(_one_call(raw, closed))
    return calls


def _one_call(raw: str, closed: bool) -> ToolCall:
    if not closed:
        return ToolCall("", {}, "the <tool_call> block is not closed by </tool_call>", raw)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCall("", {}, f"the tool call is not valid JSON ({e.msg} at column {e.colno})", raw)
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall("", {}, 'the tool call must be a JSON object {"name": str, "arguments": {...}}', raw)
    args = data.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return ToolCall(data["name"], {}, "the tool call's arguments must be a JSON object", raw)
    return ToolCall(data["name"], args, "", raw)


def _matches(value: Any, schema: dict) -> bool:
    if value is None:
        return bool(schema.get("nullable"))
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list) and all(_matches(v, schema.get("items", {})) for v in value)
    return True


def argument_errors(arguments: dict, schema: dict) -> list[str]:
    """What is wrong with ``arguments`` for the tool ``schema`` (empty: they fit)."""
    params = schema["function"]["parameters"]
    props, errors = params["properties"], []
    errors += [f"missing required argument {k!r}" for k in params["required"] if k not in arguments]
    for k, v in arguments.items():
        if k not in props:
            errors.append(f"unknown argument {k!r} (allowed: {', '.join(props) or 'none'})")
        elif not _matches(v, props[k]):
            want = props[k].get("enum") or props[k].get("type")
            errors.append(f"argument {k!r} is {json.dumps(v)}, expected {want}")
    return errors


def tool_message(content: Any) -> dict:
    """An observation message for the model: text as is, anything else as JSON."""
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    return {"role": "tool", "content": text}


async def call_tool(tools: dict[str, Tool], call: ToolCall) -> tuple[dict, bool]:
    """(the tool's answer to ``call`` as a tool message, whether the call worked); a bad call
    or a failing tool is an ``error: ...`` message, never an exception (``async def`` tools
    are awaited)."""
    if call.error:
        return tool_message(f"error: {call.error}"), False
    tool = tools.get(call.name)
    if tool is None:
        return tool_message(f"error: no tool named {call.name!r} (tools: {', '.join(tools) or 'none'})"), False
    problems = argument_errors(call.arguments, tool.schema)
    if problems:
        return tool_message(f"error: {call.name}: " + "; ".join(problems)), False
    try:
        value = tool.fn(**call.arguments)
        if inspect.isawaitable(value):
            value = await value
    except Exception as e:  # noqa: BLE001 - the tool's failure is the model's observation
        return tool_message(f"error: {call.name} raised {type(e).__name__}: {e}"), False
    return tool_message(value), True


class ToolEnvironment:
    """An environment of tools and a final-answer scorer.

    Each model turn with ``<tool_call>`` blocks gets one tool message per call (reward 0, not
    done); a turn without any is the final answer: ``score(row, text)`` is the reward and the
    episode is done.  ``schemas`` is what the runtime gives the chat template (``tools=``).
    """

    def __init__(self, tools: list[Callable], score: Callable[[dict, str], float]) -> None:
        self.tools = tool_set(tools)
        self.score = score
        self.row: dict = {}
        self.tool_calls = 0
        self.tool_errors = 0

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def reset(self, row: dict) -> list[dict]:
        self.row = row
        prompt = row["prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]

    async def step(self, text: str) -> tuple[list[dict], float, bool]:
        calls = parse_tool_calls(text)
        if not calls:
            return [], float(self.score(self.row, text)), True
        observations = []
        for call in calls:
            message, ok = await call_tool(self.tools, call)
            self.tool_calls += 1
            self.tool_errors += not ok
            observations.append(message)
        return observations, 0.0, False
