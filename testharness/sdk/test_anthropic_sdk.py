"""The official Anthropic Python SDK against the bundled example's Messages API path."""

import anthropic
import pytest

HELLO = [{"role": "user", "content": "Hello!"}]


def client(gw, **kw):
    return anthropic.Anthropic(base_url=gw.base, api_key="unused", **kw)


def test_a_message_carries_the_request_id_its_audit_line_records(gateway):
    m = client(gateway).messages.create(model="qwen3-8b", max_tokens=64, messages=HELLO)
    assert m.content
    assert m._request_id
    assert gateway.audit_of(m._request_id)["status"] == 200


def test_a_stream_carries_the_request_id(gateway):
    with client(gateway).messages.stream(model="qwen3-8b", max_tokens=64, messages=HELLO) as s:
        rid = s.response.headers["request-id"]
        assert s.response.headers["x-request-id"] == rid
        text = "".join(s.text_stream)
    assert text
    assert gateway.audit_of(rid)["status"] == 200


def test_errors_have_anthropic_shape_types_and_codes(gateway):
    c = client(gateway, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="", max_tokens=64, messages=HELLO)
    err = e.value
    assert err.status_code == 400
    assert err.type == "invalid_request_error"
    assert err.error_code == "missing_model"
    assert err.body["type"] == "error"
    assert err.body["request_id"] == err.request_id
    assert gateway.audit_of(err.request_id)["status"] == 400


def test_too_large_is_413_request_too_large(gateway):
    c = client(gateway, max_retries=0)
    big = [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]
    with pytest.raises(anthropic.APIStatusError) as e:
        c.messages.create(model="qwen3-8b", max_tokens=64, messages=big)
    assert e.value.status_code == 413
    assert e.value.type == "request_too_large"
    assert e.value.error_code == "request_too_large"


def test_budget_refusal_is_rate_limit_error(gateway):
    c = client(gateway, max_retries=0, default_headers={"x-demo-team": "sdk-anthropic"})
    with pytest.raises(anthropic.RateLimitError) as e:
        c.messages.create(model="qwen3-8b", max_tokens=5000, messages=HELLO)
    assert e.value.type == "rate_limit_error"
    # max_tokens alone is over the team's cap: no waiting admits it.
    assert e.value.error_code == "budget_request_over_cap"
    assert e.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in e.value.response.headers
