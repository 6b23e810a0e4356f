//! What a chat template may add to a prompt beyond the request body's bytes: the margin of the
//! prompt bound ([`super::bound`]).
//!
//! Measured over the published templates of Llama 3.x, Qwen 2.5 / 3, Mistral (v0.3, Small 3),
//! Gemma 2 / 3 and DeepSeek V3 / R1, rendered as vLLM renders a chat request, over 840 request
//! shapes each plus adversarial ones (`bench/results/template-margin.md`, with the script that
//! measured it). Tokens are counted as bytes, each special token as one (a true upper bound for
//! the byte-level BPE and byte-fallback SentencePiece tokenizers those models use):
//!
//! - Without tools, what no body byte pays for is a default system prompt (Mistral Small 3's,
//!   with today's date: up to 639 tokens for a one-message request) or a date header (Llama
//!   3.x: up to 54); every other family's markup is shorter than the body's JSON around each
//!   message. Hence [`BASE`].
//! - Tools are printed again by the template, with separators (`", "`, `": "`), as indented
//!   JSON (`tojson(indent=4)`: Llama 3.x, Gemma 3), with floats re-serialised (`1e15` →
//!   `1000000000000000.0`), with the server's defaults for absent fields, after a tool-use
//!   preamble, and by Mistral's templates once more before every user turn equal to the last.
//!   No constant per byte bounds the indentation (it grows with nesting), so it is computed
//!   exactly from the tools value ([`ToolsShape`]).
//! - Tool-call arguments (a JSON string in the body) are parsed by the server and printed
//!   again: at most [`ARGS_PER_BYTE`] of the arguments' length more.
//!
//! Not covered (documented in docs/budgets.md): image, audio and video parts, request-level
//! `chat_template` and `chat_template_kwargs`, templates that print tools with Python `repr`.

use serde_json::Value;

/// Tokens any template may add to a request without tools or tool calls.
pub const BASE: u64 = 672;
/// A tool-use preamble, printed when `tools` is present (an empty list included).
pub const TOOLS_PREAMBLE: u64 = 512;
/// Per tool: the server's defaults for absent fields and the template's wrapper around each.
pub const PER_TOOL: u64 = 128;
/// Per float in the tools: the longest re-serialised float.
pub const PER_FLOAT: u64 = 24;
/// Extra tokens per byte of tool-call arguments once parsed and printed again (×2 fixed point).
pub const ARGS_PER_BYTE_X2: u64 = 7;
/// [`ARGS_PER_BYTE_X2`] as a number, for docs and tests.
pub const ARGS_PER_BYTE: f64 = ARGS_PER_BYTE_X2 as f64 / 2.0;

/// The facts of a request's `tools` value the margin needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolsShape {
    /// The value's bytes as the client sent them.
    pub bytes: u64,
    /// Elements of the list.
    pub tools: u64,
    /// Bytes `json.dumps(tools, indent=4)` adds to the compact form.
    pub indent: u64,
    /// Numbers written with a fraction or an exponent.
    pub floats: u64,
}

/// What the margin depends on, read from the request's `tools` and `messages`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptShape {
    /// `tools` present (not null).
    pub tools: Option<ToolsShape>,
    /// 1 + the earlier user messages whose content equals the last user message's.
    pub repeat: u64,
    /// Decoded bytes of every `messages[].tool_calls[].function.arguments` string.
    pub args_bytes: u64,
}

/// Tokens to add to the body's bytes for the template of any measured family.
pub fn margin(shape: &PromptShape) -> u64 {
    let mut m = BASE;
    if let Some(t) = shape.tools {
        let per_render = t
            .indent
            .saturating_add(PER_FLOAT.saturating_mul(t.floats))
            .saturating_add(PER_TOOL.saturating_mul(t.tools))
            .saturating_add(t.bytes);
        m = m
            .saturating_add(TOOLS_PREAMBLE)
            .saturating_add(shape.repeat.max(1).saturating_mul(per_render));
    }
    m.saturating_add(
        shape
            .args_bytes
            .saturating_mul(ARGS_PER_BYTE_X2)
            .div_ceil(2),
    )
}

/// The shape of a request from the raw bytes of its top-level `tools` and `messages` values
/// (the scanner's spans). `messages` is only read when it matters: when `tools` is present
/// (for `repeat`) or the scanner saw `tool_calls` in a message (for the arguments). Values that
/// do not parse as the fields expect are taken at their worst (the engine refuses them anyway).
pub fn shape_of(tools: Option<&[u8]>, messages: Option<&[u8]>, tool_calls: bool) -> PromptShape {
    let tools = tools
        .filter(|raw| raw.trim_ascii() != b"null")
        .map(tools_shape);
    let mut shape = PromptShape {
        tools,
        repeat: 1,
        args_bytes: 0,
    };
    if tools.is_none() && !tool_calls {
        return shape;
    }
    let Some(messages) = messages.and_then(|m| serde_json::from_slice::<Vec<Value>>(m).ok()) else {
        // Unreadable messages: every byte might be an argument printed again.
        shape.args_bytes = messages.map_or(0, |m| m.len() as u64);
        shape.repeat = shape.args_bytes.max(1);
        return shape;
    };
    if tools.is_some() {
        let users: Vec<&Value> = messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .map(|m| m.get("content").unwrap_or(&Value::Null))
            .collect();
        if let Some((last, earlier)) = users.split_last() {
            shape.repeat = 1 + earlier.iter().filter(|c| *c == last).count() as u64;
        }
    }
    shape.args_bytes = messages
        .iter()
        .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
        .flatten()
        .map(|call| match call.pointer("/function/arguments") {
            Some(Value::String(s)) => s.len() as u64,
            // Not a string: printed as the value it is, at most its compact form again.
            Some(other) => other.to_string().len() as u64,
            None => 0,
        })
        .sum();
    shape
}

/// The shape of the tools value `raw` (JSON the scanner accepted), by one walk over its bytes
/// with an explicit stack: no recursion, so no depth the scanner allows is out of reach.
///
/// `json.dumps(v, indent=4)` puts each element or member of a non-empty container at level `L`
/// (the tools list at 0) on a line of its own indented to `L + 1` (a newline and `4 (L + 1)`
/// spaces; a member also gets a space after its colon), and closes the container on a line
/// indented to `L`; empty containers stay `[]` / `{}`.
fn tools_shape(raw: &[u8]) -> ToolsShape {
    // Per open container: whether it is an object, and whether it has an element yet.
    let mut open: Vec<(bool, bool)> = Vec::new();
    let mut shape = ToolsShape {
        bytes: raw.len() as u64,
        ..ToolsShape::default()
    };
    // An element starts at the next token (after `[`, `{` or `,`).
    let mut expect_element = false;
    let mut top_elements = 0u64;
    let mut i = 0;
    while i < raw.len() {
        let c = raw[i];
        if c.is_ascii_whitespace() || c == b':' {
            i += 1;
            continue;
        }
        if c == b']' || c == b'}' {
            if let Some((_, any)) = open.pop() {
                if any {
                    shape.indent += 1 + 4 * open.len() as u64;
                }
            }
            expect_element = false;
            i += 1;
            continue;
        }
        if c == b',' {
            expect_element = true;
            i += 1;
            continue;
        }
        if expect_element {
            let level = (open.len() as u64).saturating_sub(1);
            if let Some(top) = open.last_mut() {
                top.1 = true;
                shape.indent += 1 + 4 * (level + 1) + u64::from(top.0);
                if level == 0 {
                    top_elements += 1;
                }
            }
            expect_element = false;
        }
        match c {
            b'[' | b'{' => {
                open.push((c == b'{', false));
                expect_element = true;
                i += 1;
            }
            b'"' => {
                // A string (a key or a value): to its closing quote.
                i += 1;
                while i < raw.len() && raw[i] != b'"' {
                    i += if raw[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                // A member's key is followed by its value: not a new element.
                if open.last().is_some_and(|o| o.0) {
                    let mut j = i;
                    while j < raw.len() && raw[j].is_ascii_whitespace() {
                        j += 1;
                    }
                    if raw.get(j) == Some(&b':') {
                        i = j + 1;
                    }
                }
            }
            _ => {
                // A number or a literal: to the next delimiter.
                let start = i;
                while i < raw.len()
                    && !matches!(raw[i], b',' | b']' | b'}' | b':')
                    && !raw[i].is_ascii_whitespace()
                {
                    i += 1;
                }
                let token = &raw[start..i];
                if token
                    .first()
                    .is_some_and(|b| *b == b'-' || b.is_ascii_digit())
                    && token.iter().any(|b| matches!(b, b'.' | b'e' | b'E'))
                {
                    shape.floats += 1;
                }
                i = i.max(start + 1);
            }
        }
    }
    shape.tools = if raw.trim_ascii_start().first() == Some(&b'[') {
        top_elements
    } else {
        1
    };
    shape
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(raw: &str) -> ToolsShape {
        shape_of(Some(raw.as_bytes()), None, false)
            .tools
            .expect("tools")
    }

    #[test]
    fn indentation_is_what_python_adds_with_indent_4() {
        // len(json.dumps(v, indent=4)) - len(json.dumps(v, separators=(",", ":"))), by Python.
        for (raw, python) in [
            (r#"[{"a":1}]"#, 21),
            (r#"[]"#, 0),
            (r#"[{}]"#, 6),
            (r#"[1,2,3]"#, 16),
            (r#"[ {"a" : [1, {"b":"c"}], "d":{}} ]"#, 97),
            (r#"[{"k\"]{":"v,]"}]"#, 21),
            (
                r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]"#,
                259,
            ),
        ] {
            assert_eq!(tools(raw).indent, python, "{raw}");
        }
    }

    /// What a 4-space pretty printer (Python's `indent=4` layout) adds to the compact form.
    fn pretty_minus_compact(v: &Value) -> u64 {
        use serde::Serialize;
        let mut out = Vec::new();
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
        v.serialize(&mut ser).expect("serialize");
        (out.len() - v.to_string().len()) as u64
    }

    #[test]
    fn indentation_agrees_with_a_pretty_printer_on_random_values() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        fn gen(next: &mut dyn FnMut(u64) -> u64, depth: u32) -> Value {
            match if depth > 6 { next(4) } else { next(7) } {
                0 => Value::from(next(1000)),
                1 => Value::from(next(1000) as f64 / 7.0),
                2 => Value::from(format!("s{}\"],{{:", next(100))),
                3 => Value::Null,
                4 | 5 => Value::Array((0..next(4)).map(|_| gen(next, depth + 1)).collect()),
                _ => Value::Object(
                    (0..next(4))
                        .map(|k| (format!("k{k}"), gen(next, depth + 1)))
                        .collect(),
                ),
            }
        }
        for _ in 0..500 {
            let v = Value::Array((0..next(5)).map(|_| gen(&mut next, 1)).collect());
            let raw = v.to_string();
            assert_eq!(tools(&raw).indent, pretty_minus_compact(&v), "{raw}");
            // The same value as a client may space it.
            let spaced = serde_json::to_string_pretty(&v).expect("pretty");
            assert_eq!(tools(&spaced).indent, pretty_minus_compact(&v), "{spaced}");
        }
    }

    #[test]
    fn counts_tools_floats_and_bytes() {
        let raw = r#"[{"a":1.5,"b":1e15,"c":3},{"d":[0.1]}]"#;
        let t = tools(raw);
        assert_eq!((t.tools, t.floats, t.bytes), (2, 3, raw.len() as u64));
    }

    #[test]
    fn without_tools_or_tool_calls_the_margin_is_the_base_and_messages_are_not_read() {
        // Unparseable messages are not looked at when nothing needs them.
        let s = shape_of(None, Some(b"not json"), false);
        assert_eq!(
            s,
            PromptShape {
                tools: None,
                repeat: 1,
                args_bytes: 0
            }
        );
        assert_eq!(margin(&s), BASE);
        assert_eq!(margin(&shape_of(Some(b"null"), None, false)), BASE);
    }

    #[test]
    fn tools_add_the_preamble_and_their_printing_per_equal_user_turn() {
        let raw = r#"[{"a":1}]"#;
        let msgs = br#"[{"role":"user","content":"hi"},{"role":"assistant","content":"x"},{"role":"user","content":"hi"}]"#;
        let s = shape_of(Some(raw.as_bytes()), Some(msgs), false);
        assert_eq!(s.repeat, 2);
        let per_render = 21 + PER_TOOL + raw.len() as u64;
        assert_eq!(margin(&s), BASE + TOOLS_PREAMBLE + 2 * per_render);
        // An empty list still brings the preamble.
        let empty = shape_of(Some(b"[]"), Some(b"[]"), false);
        assert_eq!(margin(&empty), BASE + TOOLS_PREAMBLE + 2);
    }

    #[test]
    fn tool_call_arguments_count_three_and_a_half_per_byte() {
        let msgs = br#"[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{\"x\":1e15}"}}]},{"role":"tool","content":"ok"}]"#;
        let s = shape_of(None, Some(msgs), true);
        assert_eq!(s.args_bytes, 10);
        assert_eq!(margin(&s), BASE + 35);
    }

    #[test]
    fn unreadable_messages_with_tool_calls_are_taken_at_their_worst() {
        let s = shape_of(None, Some(b"[{\"role\":"), true);
        assert_eq!(s.args_bytes, 9);
    }

    #[test]
    fn deep_tools_are_walked_without_recursion() {
        let depth = 512;
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let t = tools(&deep);
        // Each of the 511 inner arrays is the one element of the one outside it.
        let expect: u64 = (0..depth as u64 - 1)
            .map(|l| (1 + 4 * (l + 1)) + (1 + 4 * l))
            .sum();
        assert_eq!((t.indent, t.tools), (expect, 1));
    }
}
