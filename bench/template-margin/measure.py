#!/usr/bin/env python3
"""Measure how many tokens a chat template adds beyond a request body's JSON bytes.

Usage: python3 measure.py TEMPLATE_DIR [--json OUT.json]

TEMPLATE_DIR holds the published chat templates (Jinja text, named as in TEMPLATES below);
this script contains no template text of its own.  Each template is rendered the way vLLM
renders a /v1/chat/completions request for a Hugging Face tokenizer:

- the Jinja environment of transformers' apply_chat_template (ImmutableSandboxedEnvironment,
  trim_blocks, lstrip_blocks, loopcontrols; `tojson` = json.dumps(ensure_ascii=False) with
  optional indent; globals raise_exception and strftime_now);
- the variables vLLM passes: messages, tools, add_generation_prompt=True, bos_token,
  eos_token, plus chat_template_kwargs (e.g. enable_thinking, tools_in_user_message);
- vLLM's request parsing: each tool is the pydantic dump of ChatCompletionToolsParam
  ({"type": "function", "function": {"name", "description": None, "parameters": None,
  ...extra keys}}); content parts are joined with "\n"; an assistant message's tool call
  `arguments` (a JSON string in the request) is parsed into an object before rendering.
  A second "raw" mode passes the tools exactly as the client sent them (other servers).

Token upper bound of the rendered prompt = its UTF-8 bytes, except each special token of the
family (listed per family below) counts 1.  Excess = that bound - the request body's bytes as
the client sent it.  The body is measured both written compactly (separators ',' ':' and raw
UTF-8, what SDKs send, the smallest body) and with Python json.dumps defaults.

Besides the realistic grid of request shapes it renders adversarial cases (what a client can
do to make a template expand its input) and checks the proposed margin rule (RULE, margin())
against every rendering.  Needs only jinja2 (tested with 3.1.6, Python 3.11).
"""

import argparse
import datetime
import itertools
import json
import math
import re
import sys
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox

# --------------------------------------------------------------------------------------------
# Families: special tokens (each counts as one token) and the bos/eos strings the tokenizer
# passes to the template.  Only tokens the tokenizer holds as added/special tokens are listed;
# everything else counts byte by byte.

LLAMA3 = dict(
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
              "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|image|>"],
)
QWEN25 = dict(
    bos="",  # Qwen tokenizers have no bos token
    eos="<|im_end|>",
    specials=["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"],
)
QWEN3 = dict(
    bos="",
    eos="<|im_end|>",
    specials=QWEN25["specials"] + ["<think>", "</think>", "<tool_response>", "</tool_response>"],
)
MISTRAL = dict(
    bos="<s>",
    eos="</s>",
    specials=["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
              "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
              "[/SYSTEM_PROMPT]", "[IMG]"],
)
GEMMA = dict(
    bos="<bos>",
    eos="<eos>",
    specials=["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
)
DEEPSEEK = dict(
    bos="<｜begin▁of▁sentence｜>",
    eos="<｜end▁of▁sentence｜>",
    specials=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
              "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
              "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
              "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"],
)

# (label, file, family, template kwargs).  Files missing from TEMPLATE_DIR are skipped.
# Files whose names start with "cz_" other than the Qwen 2.5 one are written indented for
# reading; their source says to load them with .replace('    ', '').replace('\n', '')
# (see COMPACTED below), which this script does.
TEMPLATES = [
    ("llama3.1-json (tools in user msg)", "vllm_tool_chat_template_llama3.1_json.jinja", LLAMA3, {}),
    ("llama3.1-json (tools in system)", "vllm_tool_chat_template_llama3.1_json.jinja", LLAMA3,
     {"tools_in_user_message": False}),
    ("llama3.2-json", "vllm_tool_chat_template_llama3.2_json.jinja", LLAMA3, {}),
    ("llama3-instruct (no tools)", "cz_llama-3-instruct.jinja", LLAMA3, {}),
    ("qwen2.5 official", "cz_qwen2.5-instruct.jinja", QWEN25, {}),
    ("hermes (vLLM example)", "vllm_tool_chat_template_hermes.jinja", QWEN25, {}),
    ("qwen3 official", "qwen3_official.jinja", QWEN3, {}),
    ("qwen3 official, enable_thinking=false", "qwen3_official.jinja", QWEN3,
     {"enable_thinking": False}),
    ("chatml (no tools)", "cz_chatml.jinja", QWEN25, {}),
    ("mistral-small-3 (mistral3)", "vllm_tool_chat_template_mistral3.jinja", MISTRAL, {}),
    ("mistral (vLLM example, tools|string)", "vllm_tool_chat_template_mistral.jinja", MISTRAL, {}),
    ("mistral-instruct (no tools)", "cz_mistral-instruct.jinja", MISTRAL, {}),
    ("gemma-it 2 (no tools)", "cz_gemma-it.jinja", GEMMA, {}),
    ("gemma3-pythonic", "vllm_tool_chat_template_gemma3_pythonic.jinja", GEMMA, {}),
    ("deepseek-v3", "vllm_tool_chat_template_deepseekv3.jinja", DEEPSEEK, {}),
    ("deepseek-r1", "vllm_tool_chat_template_deepseekr1.jinja", DEEPSEEK, {}),
]


COMPACTED = {"cz_llama-3-instruct.jinja", "cz_chatml.jinja", "cz_mistral-instruct.jinja",
             "cz_gemma-it.jinja"}


def load_template(path):
    text = path.read_text(encoding="utf-8")
    if path.name in COMPACTED:
        text = text.replace("    ", "").replace("\n", "")
    return text


# --------------------------------------------------------------------------------------------
# The renderer (as transformers/vLLM build it).

class TemplateRefused(Exception):
    pass


def _raise(msg):
    raise TemplateRefused(msg)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def make_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


def special_counter(specials):
    pat = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))

    def upper_bound_tokens(text):
        n_special = 0
        n_bytes = 0
        pos = 0
        for m in pat.finditer(text):
            n_bytes += len(text[pos:m.start()].encode("utf-8", "surrogatepass"))
            n_special += 1
            pos = m.end()
        n_bytes += len(text[pos:].encode("utf-8", "surrogatepass"))
        return n_bytes + n_special

    return upper_bound_tokens


# --------------------------------------------------------------------------------------------
# What the server does with the request before rendering (vLLM).

def server_tools(tools, mode):
    if tools is None:
        return None
    if mode == "raw":
        return json.loads(json.dumps(tools))
    out = []
    for t in tools:
        f = dict(t["function"])
        fn = {"name": f.pop("name"), "description": f.pop("description", None),
              "parameters": f.pop("parameters", None)}
        fn.update(f)  # extra keys (e.g. "strict") are kept, after the declared ones
        out.append({"type": t.get("type", "function"), "function": fn})
    return out


def server_messages(messages, content_format="string"):
    """vLLM's parse: content becomes a string ("string" format: text parts joined with a
    newline, None -> "") or a list of text parts ("openai" format, chosen by vLLM for templates
    that loop over message content; None -> [])."""
    conv = []
    for m in messages:
        c = dict(m)
        parts = c.get("content")
        if parts is None:
            parts = []
        elif isinstance(parts, str):
            parts = [{"type": "text", "text": parts}]
        if content_format == "string":
            c["content"] = "\n".join(p["text"] for p in parts if p.get("type") == "text")
        else:
            c["content"] = [{"type": "text", "text": p["text"]} for p in parts
                            if p.get("type") == "text"]
        if c["role"] == "assistant" and "tool_calls" in c:
            calls = []
            for tc in c["tool_calls"]:
                tc = json.loads(json.dumps(tc))
                args = tc["function"].get("arguments")
                tc["function"]["arguments"] = json.loads(args) if args else {}
                calls.append(tc)
            c["tool_calls"] = calls
        conv.append(c)
    return conv


# --------------------------------------------------------------------------------------------
# Request shapes.

TEXT = ("Summarise the attached meeting notes in three bullet points, keeping names and "
        "dates, and flag any action item that has no owner. Keep it under 120 words.")
UNICODE = "请用三句话总结会议记录，保留人名和日期。Zusammenfassung bitte auf Deutsch — danke! ✓"
CONTENTS = {"empty": "", "short": "Hi", "text": TEXT, "unicode": UNICODE}

TOOL_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string",
                             "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "Temperature unit"},
            },
            "required": ["location"],
        },
    },
}
TOOL_SEARCH = {
    "type": "function",
    "function": {
        "name": "search_documents",
        "description": "Full-text search over the team's documents. Returns at most `limit` hits.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Search terms"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10,
                          "description": "Maximum number of hits"},
                "filters": {
                    "type": "object",
                    "description": "Optional filters",
                    "properties": {
                        "author": {"type": "string", "description": "Author e-mail"},
                        "tags": {"type": "array", "items": {"type": "string"},
                                 "description": "Documents must carry all of these tags"},
                        "after": {"type": "string", "format": "date",
                                  "description": "Only documents modified after this date"},
                    },
                    "additionalProperties": False,
                },
            },
            "required": ["query"],
        },
        "strict": True,
    },
}
TOOL_TICKET = {
    "type": "function",
    "function": {
        "name": "create_ticket",
        "description": "Open a ticket in the issue tracker.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "description": "One-line summary"},
                "body": {"type": "string", "description": "Markdown body"},
                "priority": {"type": "string", "enum": ["p0", "p1", "p2", "p3"],
                             "description": "Priority"},
                "assignees": {"type": "array", "items": {"type": "string"}, "maxItems": 5,
                              "description": "User names"},
                "labels": {"type": "array",
                           "items": {"type": "object",
                                     "properties": {"name": {"type": "string"},
                                                    "color": {"type": "string",
                                                              "pattern": "^[0-9a-f]{6}$"}},
                                     "required": ["name"]},
                           "description": "Labels to attach"},
            },
            "required": ["title", "body"],
        },
    },
}
TOOL_SQL = {
    "type": "function",
    "function": {
        "name": "run_sql",
        "description": "Run a read-only SQL query against the analytics warehouse.",
        "parameters": {"type": "object",
                       "properties": {"sql": {"type": "string", "description": "The query"},
                                      "timeout_s": {"type": "number",
                                                    "description": "Timeout in seconds"}},
                       "required": ["sql"]},
    },
}
TOOL_MCP = {  # MCP-style schema with $defs (what MCP clients forward)
    "type": "function",
    "function": {
        "name": "say_hello",
        "description": "A simple greeting tool.\n\nArgs:\n  request: the greeting request",
        "parameters": {
            "$defs": {"GreetingRequest": {
                "description": "Request model for greeting tool",
                "properties": {"name": {"default": "World", "title": "Name", "type": "string"},
                               "language": {"default": "en", "title": "Language",
                                            "type": "string"}},
                "title": "GreetingRequest", "type": "object"}},
            "properties": {"request": {"$ref": "#/$defs/GreetingRequest", "title": "Request"}},
            "required": ["request"],
            "type": "object",
        },
    },
}
TOOLSETS = {
    0: None,
    1: [TOOL_WEATHER],
    5: [TOOL_WEATHER, TOOL_SEARCH, TOOL_TICKET, TOOL_SQL, TOOL_MCP],
}


def tool_call(i, name="get_current_weather", args=None):
    args = args if args is not None else {"location": "Paris, France", "unit": "celsius"}
    return {"id": f"call_{i:09d}abcdefghijklmn", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, separators=(",", ":"))}}


def build_messages(n, system, content, history):
    """n messages in all: an optional system message, then user/assistant turns starting
    with a user turn (so an even count without a system message ends with an assistant turn,
    a continuation).  Turns are distinct (a template may compare messages by value); with
    "empty" contents only the last turn is empty."""
    msgs = []
    if system:
        msgs.append({"role": "system", "content": "You are a careful assistant." if content else ""})
    turns = n - 1 if system else n
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        text = content if i == turns - 1 else (content + f" #{i}" if content else f"#{i}")
        msgs.append({"role": role, "content": text})
    if history != "none":
        k = 2 if history == "parallel" else 1
        calls = [tool_call(i) for i in range(k)]
        msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
        for c in calls:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                         "content": '{"temperature": 21, "conditions": "sunny"}'})
    return msgs


def body_bytes(body, style):
    if style == "compact":
        s = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    else:
        s = json.dumps(body)
    return len(s.encode("utf-8")), s


def tools_bytes(tools):
    if not tools:
        return 0
    return len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


# --------------------------------------------------------------------------------------------
# Adversarial shapes: things a client controls that make a template expand the tools' JSON.

def deep_tool(depth, width=1):
    """A tool whose parameters nest `depth` levels deep (objects of one key, then an array)."""
    v = [0] * width
    for _ in range(depth):
        v = {"a": v}
    return {"type": "function", "function": {"name": "f", "description": "d", "parameters": v}}


def zeros_tool(depth, n):
    """A flat array of n zeros at nesting `depth` (maximises newline+indent per byte)."""
    v = [0] * n
    for _ in range(depth):
        v = [v]
    return {"type": "function", "function": {"name": "f", "description": "d",
                                             "parameters": {"type": "object",
                                                            "properties": {}, "x": v}}}


def float_tool(n):
    """Exponent floats: 1e15 (4 bytes) is re-serialised as 1000000000000000.0 (18 bytes)."""
    return {"type": "function", "function": {"name": "f", "description": "d",
                                             "parameters": {"type": "object",
                                                            "properties": {"x": {
                                                                "type": "number",
                                                                "enum": ["@F@"] * n}}}}}


def minimal_tools(n):
    """Tools with only a name: the server's dump adds description/parameters = null."""
    return [{"type": "function", "function": {"name": f"f{i}"}} for i in range(n)]


def duplicated_desc_tool(n):
    """One parameter with a long description (hermes repeats it in the docstring)."""
    return {"type": "function", "function": {
        "name": "f", "description": "d",
        "parameters": {"type": "object",
                       "properties": {"x": {"type": "string", "description": "y" * n}}}}}


def del_tool(n):
    """DEL (0x7f) is one raw byte in JSON but repr() writes it as \\x7f (tools|string)."""
    return {"type": "function", "function": {"name": "f", "description": "\x7f" * n,
                                             "parameters": {"type": "object",
                                                            "properties": {}}}}


def adversarial_bodies():
    msgs = [{"role": "user", "content": "Hi"}]
    yield "realistic 5 tools (reference)", {"model": "m", "messages": msgs,
                                            "tools": TOOLSETS[5]}
    yield "deep nesting d=8", {"model": "m", "messages": msgs, "tools": [deep_tool(8)]}
    yield "deep nesting d=32", {"model": "m", "messages": msgs, "tools": [deep_tool(32)]}
    yield "zeros[200] at depth 6", {"model": "m", "messages": msgs, "tools": [zeros_tool(6, 200)]}
    same = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}] * 10
    yield "10 identical user turns + 1 tool", {"model": "m", "messages": same[:-1],
                                               "tools": [TOOL_WEATHER]}
    yield "empty tools array", {"model": "m", "messages": msgs, "tools": []}
    yield "no model key, 1 message", {"messages": msgs}
    yield "1 minimal tool", {"model": "m", "messages": msgs, "tools": minimal_tools(1)}
    yield "1 minimal tool, system message", {
        "model": "m", "messages": [{"role": "system", "content": ""}] + msgs,
        "tools": minimal_tools(1)}
    yield "20 minimal tools", {"model": "m", "messages": msgs, "tools": minimal_tools(20)}
    yield "duplicated description 2000", {"model": "m", "messages": msgs,
                                          "tools": [duplicated_desc_tool(2000)]}
    yield "DEL x1000 in description", {"model": "m", "messages": msgs, "tools": [del_tool(1000)]}
    yield "DEL x10000 in description", {"model": "m", "messages": msgs, "tools": [del_tool(10000)]}
    yield "exponent floats x100", {"model": "m", "messages": msgs, "tools": [float_tool(100)],
                                   "_floats": True}
    args = {"x": ["@F@"] * 100}
    yield "exponent floats x100 in tool-call args", {
        "model": "m",
        "messages": msgs + [{"role": "assistant", "content": None,
                             "tool_calls": [tool_call(0, "f", args)]},
                            {"role": "tool", "tool_call_id": "call_000000000abcdefghijklmn",
                             "name": "f", "content": "ok"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                    "parameters": {"type": "object",
                                                                   "properties": {}}}}],
        "_floats": True}


def with_floats(s):
    # Write the exponent floats literally, as a client may (json.dumps would spell 1e15 out).
    return s.replace('"@F@"', "1e15").replace('\\"@F@\\"', "1e15")



# --------------------------------------------------------------------------------------------
# The proposed rule, on facts a one-pass scanner of the client body can collect.

def indent_extra(v, level=0):
    """Bytes json.dumps(v, indent=4) adds to the compact form when v starts at `level`
    (exact): a newline and 4*(level+1) spaces before each element or member, one space after
    each member's colon, a newline and 4*level spaces before a non-empty container's close."""
    if isinstance(v, dict) and v:
        return sum(1 + 4 * (level + 1) + 1 + indent_extra(c, level + 1) for c in v.values()) \
            + 1 + 4 * level
    if isinstance(v, list) and v:
        return sum(1 + 4 * (level + 1) + indent_extra(c, level + 1) for c in v) + 1 + 4 * level
    return 0


def count_floats(v):
    """Non-integer numbers (the scanner: number tokens with '.', 'e' or 'E')."""
    if isinstance(v, float):
        return 1
    if isinstance(v, dict):
        return sum(count_floats(c) for c in v.values())
    if isinstance(v, list):
        return sum(count_floats(c) for c in v)
    return 0


def features(body):
    """What the rule reads, from the client's parsed body."""
    tools = body.get("tools") or []
    msgs = body.get("messages") or []
    users = [json.dumps(m, sort_keys=True) for m in msgs if m.get("role") == "user"]
    args = 0
    for m in msgs:
        for tc in m.get("tool_calls") or []:
            a = (tc.get("function") or {}).get("arguments")
            if isinstance(a, str):
                # the string's bytes as written in the body (escaped), what the scanner sees
                args += len(json.dumps(a, ensure_ascii=False).encode("utf-8")) - 2
    return dict(
        has_tools=body.get("tools") is not None,
        n_tools=len(tools),
        tools_bytes=len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
                        .encode("utf-8")) if tools else 0,
        indent=indent_extra(tools, 0) if tools else 0,
        floats=count_floats(tools),
        args_bytes=args,
        # user turns identical to the last one: a template that compares messages by value
        # renders the tools before each of them
        repeat=max(1, users.count(users[-1])) if users else 1,
    )


RULE = dict(A=672, T=512, W=128, F=24, D=1.0, G=3.5)


def margin(f, r=RULE):
    """The proposed margin (see RESULT.md)."""
    if not f["has_tools"] and f["args_bytes"] == 0:
        return r["A"]
    per_render = f["indent"] + r["F"] * f["floats"] + r["W"] * f["n_tools"] \
        + math.ceil(r["D"] * f["tools_bytes"])
    return r["A"] + (r["T"] if f["has_tools"] else 0) + f["repeat"] * per_render \
        + math.ceil(r["G"] * f["args_bytes"])

# --------------------------------------------------------------------------------------------

def render(env_tpl, fam, kwargs, messages, tools):
    ctx = dict(messages=messages, add_generation_prompt=True, bos_token=fam["bos"],
               eos_token=fam["eos"])
    if tools is not None:
        ctx["tools"] = tools
    ctx.update(kwargs)
    return env_tpl.render(**ctx)


_LOOPS_OVER_CONTENT = re.compile(
    r"for\s+\w+\s+in\s+(?:message|messages\[0\])(?:\[['\"]content['\"]\]|\.content)")


def content_format(template_text):
    """vLLM renders with list-of-parts content ("openai") when the template loops over a
    message's content, else with string content (its detection walks the Jinja AST; a regex
    over the same loops is enough for these templates)."""
    return "openai" if _LOOPS_OVER_CONTENT.search(template_text) else "string"


def render_any(tpl, fam, kwargs, msgs_by_format, tools, fmt):
    return render(tpl, fam, kwargs, msgs_by_format[fmt], tools)


def measure(template_dir):
    env = make_env()
    loaded = []
    for label, fname, fam, kwargs in TEMPLATES:
        p = Path(template_dir) / fname
        if not p.exists():
            print(f"skip {label}: {p} missing", file=sys.stderr)
            continue
        text = load_template(p)
        loaded.append((label, env.from_string(text), fam, kwargs,
                       special_counter(fam["specials"]), content_format(text)))

    rows = []
    grid = itertools.product([1, 2, 5, 20], [False, True], list(CONTENTS), [0, 1, 5],
                             ["none", "single", "parallel"], ["compact", "default"],
                             ["vllm", "raw"])
    shapes = []
    for n, system, ckey, nt, history, style, tmode in grid:
        if nt == 0 and tmode == "raw":
            continue
        if system and n == 1:
            continue
        msgs = build_messages(n, system, CONTENTS[ckey], history)
        body = {"model": "m", "messages": msgs}  # the shortest model name: the largest excess
        if TOOLSETS[nt]:
            body["tools"] = TOOLSETS[nt]
        b, _ = body_bytes(body, style)
        mg = margin(features(body))
        shapes.append(dict(margin=mg, n=n, system=system, content=ckey, n_tools=nt, history=history,
                           style=style, tmode=tmode, body=b, tools_bytes=tools_bytes(TOOLSETS[nt]),
                           messages={f: server_messages(msgs, f) for f in ("string", "openai")},
                           tools=server_tools(TOOLSETS[nt], tmode)))
    for label, tpl, fam, kwargs, ub, fmt in loaded:
        for s in shapes:
            try:
                text = render_any(tpl, fam, kwargs, s["messages"], s["tools"], fmt)
            except Exception as e:  # the engine answers 400: nothing to bound
                rows.append(dict(template=label, **{k: v for k, v in s.items()
                                                    if k not in ("messages", "tools")},
                                 refused=type(e).__name__))
                continue
            rows.append(dict(template=label, **{k: v for k, v in s.items()
                                                if k not in ("messages", "tools")},
                             rendered=ub(text), excess=ub(text) - s["body"]))

    adv = []
    for name, body in adversarial_bodies():
        floats = body.pop("_floats", False)
        compact = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        if floats:
            compact = with_floats(compact)
        client_body = json.loads(compact)  # what the server parses (1e15 -> float)
        b = len(compact.encode("utf-8"))
        tb = tools_bytes(client_body.get("tools"))
        if floats:
            tb = len(with_floats(json.dumps(body.get("tools"), separators=(",", ":"),
                                            ensure_ascii=False)).encode("utf-8"))
        msgs = {f: server_messages(client_body["messages"], f) for f in ("string", "openai")}
        mg = margin(features(client_body))
        for label, tpl, fam, kwargs, ub, fmt in loaded:
            try:
                text = render_any(tpl, fam, kwargs, msgs, server_tools(client_body.get("tools"), "vllm"),
                                  fmt)
            except Exception as e:
                adv.append(dict(case=name, template=label, body=b, tools_bytes=tb, margin=mg,
                                refused=type(e).__name__))
                continue
            adv.append(dict(case=name, template=label, body=b, tools_bytes=tb, margin=mg,
                            rendered=ub(text), excess=ub(text) - b))
    return rows, adv


def fit_rule(rows):
    """margin = A without tools; A + B*n_tools + ceil(C*tools_bytes) with tools."""
    ok = [r for r in rows if "excess" in r]
    no_tools = [r for r in ok if r["n_tools"] == 0]
    with_tools = [r for r in ok if r["n_tools"] > 0]
    A = max(r["excess"] for r in no_tools)
    fits = []
    for C in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0):
        B = max(math.ceil((r["excess"] - A - math.ceil(C * r["tools_bytes"])) / r["n_tools"])
                for r in with_tools)
        fits.append((C, max(B, 0)))
    return A, fits


def self_check():
    """indent_extra is exact for the tool sets used here (Gemma renders the tools list at
    indent 4 from level 0; Llama renders each tool from level 0, one level less)."""
    for tools in (TOOLSETS[1], TOOLSETS[5], [deep_tool(8)], [zeros_tool(6, 20)], minimal_tools(3)):
        compact = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
        pretty = json.dumps(tools, indent=4, ensure_ascii=False)
        assert len(pretty) - len(compact) == indent_extra(tools), tools


def main():
    self_check()
    ap = argparse.ArgumentParser()
    ap.add_argument("template_dir")
    ap.add_argument("--json", help="write all rows to this file")
    a = ap.parse_args()
    rows, adv = measure(a.template_dir)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "adversarial": adv}, indent=1))

    ok = [r for r in rows if "excess" in r]
    templates = list(dict.fromkeys(r["template"] for r in rows))

    print("## Max excess (upper-bound tokens - body bytes) per template and shape class\n")
    cols = [("no tools", lambda r: r["n_tools"] == 0 and r["history"] == "none"),
            ("no tools, tool history", lambda r: r["n_tools"] == 0 and r["history"] != "none"),
            ("1 tool", lambda r: r["n_tools"] == 1),
            ("5 tools", lambda r: r["n_tools"] == 5)]
    print("| template | " + " | ".join(c for c, _ in cols) + " | refused renders |")
    print("|---|" + "---|" * (len(cols) + 1))
    for t in templates:
        cells = []
        for _, f in cols:
            xs = [r["excess"] for r in ok if r["template"] == t and f(r)]
            cells.append(str(max(xs)) if xs else "n/a")
        refused = sum(1 for r in rows if r["template"] == t and "refused" in r)
        total = sum(1 for r in rows if r["template"] == t)
        print(f"| {t} | " + " | ".join(cells) + f" | {refused}/{total} |")

    print("\n## No tools, no tool history: max excess per template (incl. adversarial no-tool cases)\n")
    for t in templates:
        xs = [r["excess"] for r in ok if r["template"] == t and r["n_tools"] == 0
              and r["history"] == "none"]
        xs += [r["excess"] for r in adv if r["template"] == t and "excess" in r
               and r["case"] == "no model key, 1 message"]
        print(f"- {t}: {max(xs)}")

    print("\n## Max excess over all templates, per request shape "
          "(messages incl. system; tool history = assistant tool call(s) + tool result(s))\n")
    print("| messages | system | tools 0 | tools 0 + tool history | tools 1 | tools 1 + history "
          "| tools 5 | tools 5 + history |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (1, 2, 5, 20):
        for system in (False, True):
            if system and n == 1:
                continue
            cells = []
            for nt in (0, 1, 5):
                for hist in (False, True):
                    xs = [r["excess"] for r in ok if r["n"] == n and r["system"] == system
                          and r["n_tools"] == nt and (r["history"] != "none") == hist]
                    cells.append(str(max(xs)) if xs else "n/a")
            print(f"| {n} | {'yes' if system else 'no'} | " + " | ".join(cells) + " |")
    for style in ("compact", "default"):
        xs = [r["excess"] for r in ok if r["style"] == style]
        print(f"\n- body written {style}: max excess {max(xs)}")

    print("\n## Tool overhead per template: max(excess - excess without tools) for the "
          "same messages, and per tools byte\n")
    tb = {nt: tools_bytes(TOOLSETS[nt]) for nt in (1, 5)}
    print(f"tools bytes (compact): 1 tool = {tb[1]}, 5 tools = {tb[5]}\n")
    base = {}
    for r in ok:
        if r["n_tools"] == 0:
            key = (r["template"], r["n"], r["system"], r["content"], r["history"], r["style"])
            base[key] = r["excess"]
    print("| template | tools mode | +1 tool | +5 tools | slope per tools byte (1->5) |")
    print("|---|---|---|---|---|")
    for t in templates:
        for tmode in ("vllm", "raw"):
            d = {}
            for nt in (1, 5):
                xs = []
                for r in ok:
                    if r["template"] == t and r["n_tools"] == nt and r["tmode"] == tmode:
                        key = (t, r["n"], r["system"], r["content"], r["history"], r["style"])
                        if key in base:
                            xs.append(r["excess"] - base[key])
                d[nt] = max(xs) if xs else None
            if d[1] is None or d[5] is None:
                continue
            slope = (d[5] - d[1]) / (tb[5] - tb[1])
            print(f"| {t} | {tmode} | {d[1]} | {d[5]} | {slope:.3f} |")

    A, fits = fit_rule(rows)
    print(f"\n## Simple linear fit, realistic grid only (NOT sound for the adversarial shapes)"
          f"\n\nA (no tools) = {A}")
    for C, B in fits:
        print(f"- C = {C}: B (per tool) = {B}  ->  margin = {A} + {B}*n_tools + ceil({C}*tools_bytes)")

    print("\n## Adversarial tool shapes (compact body, vLLM tool dump): max over templates\n")
    print("| case | body bytes | tools bytes | max excess (template) | proposed margin |")
    print("|---|---|---|---|---|")
    for case in dict.fromkeys(r["case"] for r in adv):
        rs = [r for r in adv if r["case"] == case and "excess" in r]
        top = max(rs, key=lambda r: r["excess"])
        print(f"| {case} | {top['body']} | {top['tools_bytes']} | {top['excess']} "
              f"({top['template']}) | {top['margin']} |")

    print(f"\n## Proposed rule {RULE} checked on every rendering\n")
    allr = ok + [r for r in adv if "excess" in r]
    bad = [r for r in allr if r["excess"] > r["margin"]]
    print(f"- renderings: {len(allr)}, excess above the proposed margin: {len(bad)}")
    for r in bad[:20]:
        print(f"  - VIOLATION {r}")
    for nt in (0, 1, 5):
        xs = [r for r in ok if r["n_tools"] == nt]
        slack = min(r["margin"] - r["excess"] for r in xs)
        print(f"- realistic grid, {nt} tools: margin {min(r['margin'] for r in xs)}.."
              f"{max(r['margin'] for r in xs)}, max excess {max(r['excess'] for r in xs)}, "
              f"min slack {slack}")


if __name__ == "__main__":
    main()
