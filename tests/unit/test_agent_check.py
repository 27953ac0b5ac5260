"""The agent check (controller/postdeploy.py agent_shape) on real vLLM responses and on vLLM's own
serialization of the Qwen3 shapes (tests/fixtures/agent/README.md says which is which)."""

import json

import pytest

from qwen27b.controller.postdeploy import agent_shape
from tests.support.paths import TESTS

AGENT = TESTS / "fixtures" / "agent"


def load(name):
    return json.loads((AGENT / name).read_text())


def test_parsed_tool_call_and_parsed_answer_pass():
    shape = agent_shape(load("qwen3-tool-call-parsed.json"), expect_tool="get_weather")
    assert shape.ok and shape.reasoning_separate and shape.tool_call == "get_weather"
    answer = agent_shape(load("qwen3-answer-parsed.json"))
    assert answer.ok and answer.tool_call is None


@pytest.mark.parametrize("name, needle", [
    ("qwen3-think-in-content.json", "reasoning leaked into content"),
    ("qwen3-xml-in-content-42021.json", "XML text in content"),
    ("qwen3-call-in-reasoning-39056.json", "inside the reasoning"),
])
def test_each_known_failure_is_named(name, needle):
    shape = agent_shape(load(name), expect_tool="get_weather")
    assert not shape.ok and shape.tool_call is None and any(needle in p for p in shape.problems), shape.problems


def test_the_real_cpu_recordings_show_why_the_cpu_profile_keeps_the_parsers_off():
    chat = load("cpu-smollm2-qwen3-parser-chat.json")
    assert chat["choices"][0]["message"]["content"] is None and chat["choices"][0]["message"]["reasoning"]
    assert any("whole answer is in reasoning" in p for p in agent_shape(chat).problems)
    tools = agent_shape(load("cpu-smollm2-qwen3-parser-tools.json"), expect_tool="get_weather")
    assert tools.problems == ("no get_weather call in tool_calls",)


def test_older_reasoning_content_field_and_bad_arguments():
    body = load("qwen3-tool-call-parsed.json")
    message = body["choices"][0]["message"]
    message["reasoning_content"] = message.pop("reasoning")
    message["tool_calls"][0]["function"]["arguments"] = "{city: Paris"
    shape = agent_shape(body, expect_tool="get_weather")
    assert shape.tool_call == "get_weather" and shape.problems == ("tool call get_weather: arguments are not JSON",)
