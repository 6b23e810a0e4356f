"""The official OpenAI Python SDK against the bundled example: what it returns and raises."""

import urllib.error
import urllib.request

import openai
import pytest

HELLO = [{"role": "user", "content": "Hello!"}]


def client(gw, **kw):
    return openai.OpenAI(base_url=gw.url, api_key="unused", **kw)


def test_models_list_and_retrieve_agree(gateway):
    c = client(gateway)
    listed = {m.id: m for m in c.models.list()}
    assert {"qwen3-8b", "meta-llama/Llama-3.3-70B-Instruct", "gpt-5"} <= set(listed)
    for model_id, entry in listed.items():
        got = c.models.retrieve(model_id)
        assert got.id == model_id
        assert got.model_dump() == entry.model_dump()
    qwen = c.models.retrieve("qwen3-8b")
    assert qwen.context_length == 32768
    assert qwen._request_id


def test_retrieving_an_unlisted_model_is_404_model_not_found(gateway):
    with pytest.raises(openai.NotFoundError) as e:
        client(gateway, max_retries=0).models.retrieve("no-such-model")
    assert e.value.status_code == 404
    assert e.value.code == "model_not_found"
    assert e.value.type == "invalid_request_error"
    assert e.value.param == "model"
    assert e.value.request_id
    assert gateway.audit_of(e.value.request_id)["status"] == 404


def test_a_completion_carries_the_request_id_its_audit_line_records(gateway):
    r = client(gateway).chat.completions.create(model="qwen3-8b", messages=HELLO)
    assert r.choices[0].message.content
    assert r._request_id
    audit = gateway.audit_of(r._request_id)
    assert (audit["status"], audit["backend"]) == (200, "qwen3-8b")


def test_a_stream_carries_the_request_id(gateway):
    with client(gateway).chat.completions.create(
        model="qwen3-8b", messages=HELLO, stream=True, stream_options={"include_usage": True}
    ) as stream:
        rid = stream.response.headers["x-request-id"]
        chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None
    assert gateway.audit_of(rid)["status"] == 200


def test_every_response_has_a_request_id_even_unrouted_ones(gateway):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(gateway.base + "/v2/unknown")
    assert e.value.code == 404
    assert e.value.headers.get("x-request-id")


def test_errors_carry_code_and_request_id(gateway):
    c = client(gateway, max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="", messages=HELLO)
    assert (e.value.status_code, e.value.code, e.value.param) == (400, "missing_model", "model")
    assert gateway.audit_of(e.value.request_id)["status"] == 400
    assert "retry-after" not in e.value.response.headers


def test_a_request_over_the_cap_on_its_own_is_a_rate_limit_error_not_retried(gateway):
    # max_tokens alone is over the team's cap: no waiting admits it, so the answer tells the
    # SDK not to retry (its default client would otherwise sleep and try again).
    c = client(gateway, max_retries=0, default_headers={"x-demo-team": "sdk-openai"})
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model="qwen3-8b", messages=HELLO, max_tokens=5000)
    assert e.value.code == "budget_request_over_cap"
    assert e.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in e.value.response.headers
    assert e.value.request_id


def test_a_local_backend_gets_its_served_model_name(gateway):
    c = client(gateway)
    gateway.command(op="clear")
    r = c.chat.completions.create(
        model="anything",
        messages=HELLO,
        extra_headers={"x-llmkube-task-complexity": "complex"},
    )
    assert r.choices[0].message.content
    sent = gateway.command(op="last", mock="llama")
    assert sent["body"]["model"] == "meta-llama/Llama-3.3-70B-Instruct"
    assert sent["body"]["messages"] == HELLO
    # Where no served name is known, the client's name goes through as it was.
    c.chat.completions.create(model="qwen3-8b", messages=HELLO)
    assert gateway.command(op="last", mock="qwen")["body"]["model"] == "qwen3-8b"
