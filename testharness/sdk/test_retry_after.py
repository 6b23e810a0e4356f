"""Retry-After when every backend a request could use is quarantined (Envoy ejects a backend
after one 5xx for `quarantineDuration`), and what the SDKs' retries make of it."""

import anthropic
import openai
import pytest

from conftest import QUARANTINE_S

HELLO = [{"role": "user", "content": "Hello!"}]


def openai_client(gw, **kw):
    return openai.OpenAI(base_url=gw.url, api_key="unused", **kw)


def test_a_quarantined_route_says_when_to_come_back(fresh_gateway):
    gw = fresh_gateway
    once = openai_client(gw, max_retries=0)
    gw.command(op="fail", mock="qwen", n=1, status=500)
    with pytest.raises(openai.InternalServerError) as e:
        once.chat.completions.create(model="qwen3-8b", messages=HELLO)
    first = e.value
    assert (first.status_code, first.code) == (502, "all_backends_failed")
    # Ejected for the quarantine, released on Envoy's next 1 s outlier tick.
    assert 1 <= int(first.response.headers["retry-after"]) <= QUARANTINE_S + 1
    gw.command(op="wait_ejected", backend="qwen3-8b", active=1)
    with pytest.raises(openai.InternalServerError) as e:
        once.chat.completions.create(model="qwen3-8b", messages=HELLO)
    assert e.value.code == "all_backends_failed"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= QUARANTINE_S + 1
    assert gw.command(op="hits", mock="qwen")["hits"] == 1, "the ejected backend got nothing"
    # With its default retries the SDK waits as told and gets through once the backend is back
    # (its own back-off alone, 0.5 s then 1 s, would still find it ejected).
    r = openai_client(gw).chat.completions.create(model="qwen3-8b", messages=HELLO)
    assert r.choices[0].message.content
    assert gw.audit_of(r._request_id)["status"] == 200


def test_fail_closed_while_every_local_backend_is_quarantined(fresh_gateway):
    gw = fresh_gateway
    gw.command(op="fail", mock="llama", n=1, status=500)
    gw.command(op="fail", mock="qwen", n=1, status=500)
    pii = {"x-llmkube-classification": "pii"}
    c = anthropic.Anthropic(base_url=gw.base, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as e:
        c.messages.create(model="gpt-5", max_tokens=64, messages=HELLO, extra_headers=pii)
    assert e.value.status_code == 503
    assert (e.value.type, e.value.error_code) == ("overloaded_error", "fail_closed")
    assert 1 <= int(e.value.response.headers["retry-after"]) <= QUARANTINE_S + 1
    assert gw.command(op="hits", mock="litellm")["hits"] == 0, "never the cloud"
    m = anthropic.Anthropic(base_url=gw.base, api_key="unused").messages.create(
        model="gpt-5", max_tokens=64, messages=HELLO, extra_headers=pii
    )
    assert m.content
    assert gw.command(op="hits", mock="litellm")["hits"] == 0


def test_no_retry_after_when_nothing_is_quarantined(fresh_gateway):
    gw = fresh_gateway
    with pytest.raises(openai.BadRequestError) as e:
        openai_client(gw, max_retries=0).chat.completions.create(model="", messages=HELLO)
    assert "retry-after" not in e.value.response.headers
