"""Mem-T's tool calls: names, the ``<tool_call>{json}</tool_call>`` format, a tolerant parser.

The released prompts (App. C) define each tool as a JSON function; an output holds one call per
``<tool_call>`` tag (formation may hold several). Parsing never raises: it returns the calls and
an error string naming what was wrong (unclosed tag, not JSON, unknown tool, too many calls).
"""

from __future__ import annotations

import json
import re

from memkit.envs.memory_store import MemoryStore, StoreError
from memkit.world.conversation import Conversation

FORMATION_TOOLS = ("create_fact", "create_experience", "update_persona", "update_summary")
EVOLUTION_TOOLS = ("add_item", "update_item", "delete_item", "ignore_item")
#: retrieval tool -> the memory type it searches (eq. 6), plus ``finish``
SEARCH_TOOLS = {
    "search_facts": "fact",
    "search_experiences": "experience",
    "search_personas": "persona",
    "search_turns": "raw",
    "search_summary": "summary",
}
RETRIEVAL_TOOLS = (*SEARCH_TOOLS, "finish")
ROLES = ("form", "evolve", "act")

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def tool_call(tool: str, **arguments) -> str:
    """The text of one tool call: ``<tool_call>{"name": tool, "arguments": {...}}</tool_call>``."""
    return "<tool_call>" + json.dumps({"name": tool, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def parse_tool_calls(text: str, allowed: tuple[str, ...], at_most: int | None = None) -> tuple[list[dict], str | None]:
    """The tool calls in ``text`` and an error (None when every call is well formed and allowed)."""
    if not isinstance(text, str):
        return [], "empty output"
    if text.count("<tool_call>") != text.count("</tool_call>"):
        return [], "unclosed <tool_call>"
    bodies = _TOOL_CALL.findall(text)
    if not bodies:
        return [], "no <tool_call>"
    if at_most is not None and len(bodies) > at_most:
        return [], f"{len(bodies)} tool calls where {at_most} is allowed"
    calls = []
    for body in bodies:
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            return [], f"tool call is not JSON ({e.msg})"
        except RecursionError:
            return [], "tool call nested too deeply"
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return [], "tool call without a name"
        args = call.get("arguments", {})
        if not isinstance(args, dict):
            return [], f"{call['name']}: arguments must be an object"
        if call["name"] not in allowed:
            return [], f"unknown tool {call['name']!r} (allowed: {', '.join(allowed)})"
        calls.append({"name": call["name"], "arguments": args})
    return calls, None


def text_arg(args: dict, key: str, required: bool = True) -> str:
    value = args.get(key, "")
    if not isinstance(value, (str, int, float)) or (required and not str(value).strip()):
        raise StoreError(f"argument {key!r} must be a non-empty string")
    return str(value).strip()


# ---- a Mem-T episode's state (AgentState.memory, written by memkit.agents.memt.MemT) -------------
def stream_conversation(state) -> Conversation:
    """The conversation a Mem-T episode reads: read it here, not by its key in ``state.memory``."""
    return state.memory["conversation"]


def stream_store(state) -> MemoryStore:
    """The memory store a Mem-T episode has built so far."""
    return state.memory["store"]
