//! What a request may cost at most, reserved before it goes upstream.
//!
//! The scanner reads what the bound needs (`max_tokens` and its kin, `n`/`best_of`, `stream`,
//! `stream_options.include_usage`: [`crate::scan::Knobs`]) in its one pass over the body, so
//! admission needs neither the body again nor a second walk over it (a body that arrived in
//! pieces is not kept).
//!
//! The bound, per request (documented in docs/budgets.md):
//! - prompt ≤ body bytes + the template margin ([`super::template`]): tokenizers in use
//!   (byte-level BPE, SentencePiece with byte fallback) emit at most one token per byte of
//!   text, the JSON around each message is longer than the chat template's own tokens, and the
//!   margin covers what templates add from nothing (default system prompts, tool preambles)
//!   or print again (tools, tool-call arguments). Images given by URL are the exception (their
//!   tokens are not in the body).
//! - completion ≤ the client's `max_tokens` / `max_completion_tokens` / `max_output_tokens`;
//!   without one, the backend's `contextLength`; without that, the gateway sets `max_tokens` to
//!   the configured default ([`Bound::set_max_tokens`]) so the bound still holds.
//! - prompt + completion ≤ `contextLength` when the backend declares it (the engine refuses more).

use crate::scan::Fields;

/// The request-body facts budgets need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    pub body_bytes: u64,
    /// The largest completion cap the client sent, if any (a backend may read any of them).
    pub max_output: Option<u64>,
    /// Completions asked for (`n`, `best_of`: the larger), at least 1.
    pub choices: u64,
    pub stream: bool,
    /// `stream_options.include_usage` as the client sent it.
    pub include_usage: Option<bool>,
    /// Tokens the chat template may add ([`super::template::margin`]).
    pub template_margin: u64,
    /// The body has `tools` or tool calls: the margin depends on them
    /// ([`super::template::shape_of`]), and [`Self::template_margin`] is only the base until the
    /// caller set it from their bytes.
    pub template_needs_shape: bool,
}

impl Default for RequestFacts {
    fn default() -> Self {
        RequestFacts {
            body_bytes: 0,
            max_output: None,
            choices: 1,
            stream: false,
            include_usage: None,
            template_margin: super::template::BASE,
            template_needs_shape: false,
        }
    }
}

/// The facts of a body of `body_bytes` the scanner accepted (`fields` is its answer).
pub fn request_facts(body_bytes: usize, fields: &Fields) -> RequestFacts {
    let k = &fields.knobs;
    RequestFacts {
        body_bytes: body_bytes as u64,
        max_output: k.max_output,
        choices: k.choices.unwrap_or(1).max(1),
        stream: fields.stream,
        include_usage: k.include_usage,
        template_margin: super::template::BASE,
        template_needs_shape: fields.spans.tools.is_some() || k.tool_calls,
    }
}

/// The most a request can use, in tokens, before prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub prompt: u64,
    pub completion: u64,
    /// prompt + completion never exceeds this (the backend's `contextLength`, times the number
    /// of completions: a loose but safe bound, the prompt is billed once).
    pub total: Option<u64>,
    /// The client set no completion cap and the backend declares no context length: the gateway
    /// must set `max_tokens` to this in the request for the bound to hold.
    pub set_max_tokens: Option<u64>,
}

/// See the module doc. `default_max_output` is the completion cap the gateway imposes when
/// nothing else bounds the completion.
pub fn upper_bound(
    f: &RequestFacts,
    context_length: Option<u64>,
    default_max_output: u64,
) -> Bound {
    let mut prompt = f.body_bytes.saturating_add(f.template_margin);
    let (per_choice, set_max_tokens) = match (f.max_output, context_length) {
        (Some(m), _) => (m, None),
        (None, Some(c)) => (c, None),
        (None, None) => (default_max_output, Some(default_max_output)),
    };
    // Each of `n` completions may reach the cap; the context bounds each one, not their sum.
    let choices = f.choices.max(1);
    if let Some(c) = context_length {
        prompt = prompt.min(c);
    }
    let per_choice = context_length.map_or(per_choice, |c| per_choice.min(c));
    Bound {
        prompt,
        completion: per_choice.saturating_mul(choices),
        total: context_length.map(|c| c.saturating_mul(choices)),
        set_max_tokens,
    }
}

impl Bound {
    /// Tokens and pico-dollars to reserve at `price`: the dearest split of at most `total` tokens
    /// between prompt (≤ `prompt`) and completion (≤ `completion`).
    pub fn amount(&self, price: &super::money::Price) -> super::window::Amount {
        let total = self
            .total
            .unwrap_or(u64::MAX)
            .min(self.prompt.saturating_add(self.completion));
        let (p, c) = if price.completion >= price.prompt {
            let c = self.completion.min(total);
            (self.prompt.min(total - c), c)
        } else {
            let p = self.prompt.min(total);
            (p, self.completion.min(total - p))
        };
        super::window::Amount::new(p.saturating_add(c), price.cost(p, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::money::Price;
    use crate::scan::Scanner;

    fn facts(body: &str) -> RequestFacts {
        let fields = Scanner::new().scan(body.as_bytes()).unwrap();
        request_facts(body.len(), &fields)
    }

    #[test]
    fn reads_completion_caps_stream_and_include_usage() {
        let f = facts(
            r#"{"model":"m","messages":[{"role":"user","content":"max_tokens: 5"}],"max_tokens":120}"#,
        );
        assert_eq!(f.max_output, Some(120));
        assert!(!f.stream);
        assert_eq!(f.include_usage, None);
        let f = facts(
            r#"{"max_completion_tokens":300,"model":"m","stream":true,"stream_options":{"include_usage":false},"max_tokens":200}"#,
        );
        assert_eq!(
            (f.max_output, f.stream, f.include_usage),
            (Some(300), true, Some(false))
        );
        let f = facts(
            r#"{"model":"m","input":"hi","max_output_tokens":7,"stream_options":{"include_usage":true}}"#,
        );
        assert_eq!((f.max_output, f.include_usage), (Some(7), Some(true)));
        // Escaped key: the backend reads max_tokens, so do we.
        let f = facts(r#"{"model":"m","max\u005ftokens":9}"#);
        assert_eq!(f.max_output, Some(9));
        // Nested, null, negative, fractional or string caps are not caps.
        for body in [
            r#"{"model":"m","metadata":{"max_tokens":5}}"#,
            r#"{"model":"m","max_tokens":null}"#,
            r#"{"model":"m","max_tokens":-1}"#,
            r#"{"model":"m","max_tokens":1.5}"#,
            r#"{"model":"m","max_tokens":"10"}"#,
            r#"{"model":"m","x":[1,{"max_tokens":2},"]"],"y":{}}"#,
        ] {
            assert_eq!(facts(body).max_output, None, "{body}");
        }
        let body = " {\n \"model\" : \"m\" ,\n \"max_tokens\" : 42 \n} ";
        assert_eq!(facts(body).max_output, Some(42));
        assert_eq!(facts(body).choices, 1);
        assert_eq!(facts(r#"{"model":"m","n":3,"best_of":5}"#).choices, 5);
        assert_eq!(facts(r#"{"model":"m","n":0}"#).choices, 1);
    }

    #[test]
    fn include_usage_is_read_only_directly_inside_a_stream_options_object() {
        for body in [
            r#"{"model":"m","stream_options":{"include_usage":1},"x":[true]}"#,
            r#"{"model":"m","stream_options":{"a":{"include_usage":true}}}"#,
            r#"{"model":"m","stream_options":[{"include_usage":true}]}"#,
            r#"{"model":"m","stream_options":{"include_usage":[true]}}"#,
            r#"{"model":"m","metadata":{"include_usage":true}}"#,
            r#"{"model":"m","include_usage":true}"#,
        ] {
            assert_eq!(facts(body).include_usage, None, "{body}");
        }
        let f =
            facts(r#"{"model":"m","stream_options":{"x":[1,{"y":null}],"include_usage":false}}"#);
        assert_eq!(f.include_usage, Some(false));
        // However long the object (a client's `false` must be seen, or the gateway would add
        // a second include_usage).
        let long = format!(
            r#"{{"model":"m","stream_options":{{"pad":"{}","include_usage":false}}}}"#,
            "x".repeat(8192)
        );
        assert_eq!(facts(&long).include_usage, Some(false));
    }

    #[test]
    fn the_bound_uses_max_tokens_then_context_length_then_the_default() {
        let f = RequestFacts {
            body_bytes: 1000,
            max_output: Some(50),
            ..Default::default()
        };
        let b = upper_bound(&f, None, 4096);
        assert_eq!((b.prompt, b.completion, b.set_max_tokens), (1672, 50, None));
        let f = RequestFacts {
            body_bytes: 1000,
            ..Default::default()
        };
        let b = upper_bound(&f, Some(8192), 4096);
        assert_eq!((b.prompt, b.completion, b.total), (1672, 8192, Some(8192)));
        assert_eq!(b.amount(&Price::default()).tokens, 8192);
        let b = upper_bound(&f, None, 4096);
        assert_eq!((b.completion, b.set_max_tokens), (4096, Some(4096)));
        // Three completions of up to 50 each.
        let f = RequestFacts {
            body_bytes: 10,
            max_output: Some(50),
            choices: 3,
            ..Default::default()
        };
        let b = upper_bound(&f, Some(100), 4096);
        assert_eq!((b.prompt, b.completion, b.total), (100, 150, Some(300)));
    }

    #[test]
    fn the_usd_bound_is_the_dearest_split_within_the_context() {
        let price = Price {
            prompt: 1,
            completion: 10,
        };
        let b = Bound {
            prompt: 600,
            completion: 800,
            total: Some(1000),
            set_max_tokens: None,
        };
        // Completion is dearer: 800 completion + 200 prompt.
        assert_eq!(b.amount(&price).pico, 800 * 10 + 200);
        let cheap_out = Price {
            prompt: 10,
            completion: 1,
        };
        assert_eq!(b.amount(&cheap_out).pico, 600 * 10 + 400);
        let open = Bound { total: None, ..b };
        assert_eq!(open.amount(&price).tokens, 1400);
        assert_eq!(open.amount(&price).pico, 600 + 8000);
    }
}
