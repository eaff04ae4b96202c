"""Tools: schemas from hints and docstrings, Qwen tool calls parsed, called with checked
arguments, and the ToolEnvironment adapter through the episode runner."""

from __future__ import annotations

import asyncio
from typing import Literal, Optional

import pytest

from bidirl.algo.episode import run_episode
from bidirl.algo.tools import (
    ToolEnvironment,
    ToolSchemaError,
    call_tool,
    parse_docstring,
    parse_tool_calls,
    tool_schema,
    tool_set,
)


def lookup(key: str, exact: bool = True) -> str:
    """Read one value from the table.

    Args:
        key: the key to read,
            as written in the question.
        exact (bool): match the key exactly.

    Returns:
        The value.
    """
    return {"k1": "42"}.get(key, "not found")


def search(query: str, limit: Optional[int] = None, tags: list[str] = (),  # noqa: UP045 - Optional on purpose
           mode: Literal["fast", "deep"] = "fast", weight: float = 1.0, extra: dict | None = None) -> list:
    """Search the corpus.

    :param query: what to look for.
    :param int limit: the most results.
    :returns: the hits.
    """
    return [query] * (limit or 1)


def test_google_style_schema():
    assert tool_schema(lookup) == {"type": "function", "function": {
        "name": "lookup", "description": "Read one value from the table.",
        "parameters": {"type": "object", "required": ["key"], "properties": {
            "key": {"type": "string", "description": "the key to read, as written in the question."},
            "exact": {"type": "boolean", "description": "match the key exactly."}}}}}


def test_rest_style_and_every_type():
    fn = tool_schema(search)["function"]
    assert fn["description"] == "Search the corpus."
    props = fn["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for."}
    assert props["limit"] == {"type": "integer", "nullable": True, "description": "the most results."}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["mode"] == {"type": "string", "enum": ["fast", "deep"]}
    assert props["weight"] == {"type": "number"}
    assert props["extra"] == {"type": "object", "nullable": True}
    assert fn["parameters"]["required"] == ["query"]


def test_no_docstring_and_no_parameters():
    def now() -> str:
        return "noon"

    assert tool_schema(now)["function"] == {"name": "now", "description": "",
                                            "parameters": {"type": "object", "properties": {}, "required": []}}
    assert parse_docstring(None) == ("", {})


def test_async_tool_schema():
    async def fetch(url: str) -> str:
        """Fetch a page."""
        return url

    assert tool_schema(fetch)["function"]["description"] == "Fetch a page."


@pytest.mark.parametrize(("fn", "needle"), [
    (lambda x: x, "parameter x: no type hint"),
])
def test_undescribable_lambda(fn, needle):
    with pytest.raises(ToolSchemaError, match=needle):
        tool_schema(fn)


def test_undescribable_signatures():
    def star(*args: str) -> None: ...

    def union(x: int | str) -> None: ...

    def obj(x: object) -> None: ...

    def lit(x: Literal[1, "a"]) -> None: ...

    for fn, needle in [(star, r"\*args"), (union, "union"), (obj, "type object is not supported"),
                       (lit, "values of one of")]:
        with pytest.raises(ToolSchemaError, match=needle):
            tool_schema(fn)
    with pytest.raises(ToolSchemaError, match="two tools named 'lookup'"):
        tool_set([lookup, lookup])


def test_parse_one_several_and_malformed():
    text = ('Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "k1"}}\n</tool_call>\n'
            '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"k2\\"}"}</tool_call>'
            '<tool_call>{"name": "lookup", "arguments": {"key": </tool_call>'
            '<tool_call>["lookup"]</tool_call>'
            '<tool_call>{"name": "lookup", "arguments": [1]}</tool_call>'
            '<tool_call>{"name": "lookup"')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("lookup", {"key": "k1"}), ("lookup", {"key": "k2"})]
    assert not calls[0].error and not calls[1].error
    assert "not valid JSON" in calls[2].error
    assert "must be a JSON object" in calls[3].error
    assert "arguments must be a JSON object" in calls[4].error
    assert "not closed" in calls[5].error
    assert parse_tool_calls("the answer is 42") == []


def call(tools, text):
    return asyncio.run(call_tool(tools, parse_tool_calls(text)[0]))


def test_call_checks_arguments():
    tools = tool_set([lookup, search])
    assert call(tools, '<tool_call>{"name": "lookup", "arguments": {"key": "k1"}}</tool_call>') == (
        {"role": "tool", "content": "42"}, True)
    assert call(tools, '<tool_call>{"name": "search", "arguments": {"query": "a", "limit": 2}}</tool_call>') == (
        {"role": "tool", "content": '["a", "a"]'}, True)
    for args, needle in [("{}", "missing required argument 'key'"),
                         ('{"key": 3}', "argument 'key' is 3, expected string"),
                         ('{"key": "k", "exact": 1}', "argument 'exact' is 1, expected boolean"),
                         ('{"key": "k", "colour": "red"}', "unknown argument 'colour'")]:
        message, ok = call(tools, f'<tool_call>{{"name": "lookup", "arguments": {args}}}</tool_call>')
        assert not ok and message["role"] == "tool" and needle in message["content"]
    message, ok = call(tools, '<tool_call>{"name": "search", "arguments": {"query": "a", "mode": "slow"}}'
                              '</tool_call>')
    assert not ok and "expected ['fast', 'deep']" in message["content"]
    message, ok = call(tools, '<tool_call>{"name": "search", "arguments": {"query": "a", "tags": [1]}}</tool_call>')
    assert not ok and "'tags'" in message["content"]
    message, ok = call(tools, '<tool_call>{"name": "calc", "arguments": {}}</tool_call>')
    assert not ok and "no tool named 'calc'" in message["content"]
    message, ok = call(tools, "<tool_call>{oops}</tool_call>")
    assert not ok and message["content"].startswith("error: the tool call is not valid JSON")


def test_a_failing_tool_is_an_observation():
    def divide(a: int, b: int) -> float:
        """Divide."""
        return a / b

    message, ok = call(tool_set([divide]), '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>')
    assert not ok and message == {"role": "tool", "content": "error: divide raised ZeroDivisionError: division by zero"}


def test_tool_environment_through_the_runner():
    async def slow_lookup(key: str) -> str:
        """Read a value."""
        await asyncio.sleep(0)
        return {"k1": "42"}.get(key, "not found")

    env = ToolEnvironment([slow_lookup], lambda row, text: float(text.strip() == row["reward_model"]["ground_truth"]))
    assert env.schemas[0]["function"]["name"] == "slow_lookup"
    script = iter(['<tool_call>{"name": "slow_lookup", "arguments": {"key": "k1"}}</tool_call>'
                   '<tool_call>{"name": "slow_lookup", "arguments": {}}</tool_call>', "42"])
    row = {"prompt": "what is k1?", "reward_model": {"ground_truth": "42"}}
    traj = run_episode(env, row, lambda messages: next(script), lambda t: len(t))
    assert traj.outcome == "done" and traj.reward == 1.0
    assert [t.role for t in traj.turns] == ["user", "assistant", "tool", "tool", "assistant"]
    assert traj.turns[2].text == "42" and traj.turns[3].text.startswith("error: slow_lookup: missing")
    assert env.tool_calls == 2 and env.tool_errors == 1
