//! `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens` from a response body
//! that goes by in pieces (a JSON body, or the usage chunk of an event stream), without
//! buffering or parsing it: the response is passed on as it comes and only watched.

use super::Outcome;

/// What one request's response says about the pod it was sent to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Where the picked backend sits in the attempt order.
    pub position: usize,
    /// The response status, if a response came.
    pub status: Option<u32>,
    /// Envoy's attempt count (`x-envoy-attempt-count`; 0 or 1 for one attempt).
    pub attempts: u32,
    /// The response reached its end.
    pub complete: bool,
    /// The stream idle timeout cut it.
    pub went_silent: bool,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

impl Seen {
    /// The outcome the pick's ticket is released with.
    pub fn outcome(&self) -> Outcome {
        let Some(status) = self.status else {
            // No response at all: the client went away (a refused connection still gets the
            // proxy's own 503).
            return Outcome::Aborted;
        };
        let ours = self.position as u32 + 1;
        let attempts = self.attempts.max(1);
        if attempts > ours {
            // The proxy moved past this backend: its attempt failed.
            return Outcome::Failed;
        }
        if attempts < ours {
            // Answered before this backend's turn came.
            return Outcome::Aborted;
        }
        if status >= 500 {
            return Outcome::Failed;
        }
        if !self.complete {
            return if self.went_silent {
                Outcome::StreamIdle
            } else {
                Outcome::Aborted
            };
        }
        Outcome::Done {
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
        }
    }
}

/// Bytes kept from the end of one piece, so a key and its number split across two pieces are
/// still read (longer than `"cached_tokens" : 18446744073709551615`).
const CARRY: usize = 64;

/// The last values seen of the two counts.
#[derive(Debug, Default, Clone)]
pub struct UsageWatch {
    carry: Vec<u8>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

impl UsageWatch {
    /// Looks at the next piece of the body.
    pub fn feed(&mut self, piece: &[u8]) {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(piece);
        // A number that ended before the previous piece did was read with that piece (one
        // running to its end was not: it may have continued).
        let fresh_from = buf.len() - piece.len();
        for (key, slot) in [
            (&b"\"prompt_tokens\""[..], &mut self.prompt_tokens),
            (&b"\"cached_tokens\""[..], &mut self.cached_tokens),
        ] {
            let mut at = 0;
            while let Some(off) = find(&buf[at..], key) {
                let start = at + off;
                at = start + 1;
                // An escaped quote is text inside a string, not a key.
                if start > 0 && buf[start - 1] == b'\\' {
                    continue;
                }
                match number_after(&buf[start + key.len()..]) {
                    Some((v, end)) if start + key.len() + end >= fresh_from => *slot = Some(v),
                    _ => {}
                }
            }
        }
        let keep = buf.len().saturating_sub(CARRY);
        self.carry = buf.split_off(keep);
    }
}

/// Where `needle` (a quoted key) first occurs in `hay`. Only a byte equal to the needle's first
/// (the quote) starts a comparison, and its second byte is checked before the rest: a compare
/// at every offset was most of the response path's work.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut at = 0;
    while let Some(k) = hay.get(at..)?.iter().position(|&b| b == first) {
        let start = at + k;
        let after = &hay[start + 1..];
        if after.first() == rest.first() && after.starts_with(rest) {
            return Some(start);
        }
        at = start + 1;
    }
    None
}

/// `\s*:\s*digits` at the start of `s`, and where the digits end; `None` if incomplete.
fn number_after(s: &[u8]) -> Option<(u64, usize)> {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let mut i = s.iter().position(|b| !ws(b))?;
    if s[i] != b':' {
        return None;
    }
    i += 1;
    i += s[i..].iter().position(|b| !ws(b))?;
    let digits = s[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    // Digits running to the end of the piece may continue in the next one.
    if digits == 0 || i + digits == s.len() {
        return None;
    }
    let text = std::str::from_utf8(&s[i..i + digits]).ok()?;
    Some((text.parse().ok()?, i + digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"choices":[{"message":{"content":"say \"prompt_tokens\": 7"}}],"usage":{"prompt_tokens": 120,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":64}}}"#;

    #[test]
    fn reads_both_counts_in_one_piece_and_ignores_quoted_text() {
        let mut w = UsageWatch::default();
        w.feed(BODY);
        assert_eq!((w.prompt_tokens, w.cached_tokens), (Some(120), Some(64)));
    }

    #[test]
    fn reads_counts_split_anywhere_across_pieces() {
        for cut in 1..BODY.len() {
            let mut w = UsageWatch::default();
            w.feed(&BODY[..cut]);
            w.feed(&BODY[cut..]);
            assert_eq!(
                (w.prompt_tokens, w.cached_tokens),
                (Some(120), Some(64)),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn outcomes_follow_the_attempt_that_reached_the_pod() {
        let done = Seen {
            status: Some(200),
            attempts: 1,
            complete: true,
            cached_tokens: Some(64),
            ..Seen::default()
        };
        assert_eq!(
            done.outcome(),
            Outcome::Done {
                prompt_tokens: None,
                cached_tokens: Some(64)
            }
        );
        let with = |f: &dyn Fn(&mut Seen)| {
            let mut s = done;
            f(&mut s);
            s.outcome()
        };
        assert_eq!(with(&|s| s.status = None), Outcome::Aborted);
        assert_eq!(with(&|s| s.status = Some(503)), Outcome::Failed);
        assert_eq!(
            with(&|s| s.status = Some(429)),
            done.outcome(),
            "a 4xx is the client's"
        );
        // First in the order, and Envoy went on to a second attempt: this pod failed.
        assert_eq!(with(&|s| s.attempts = 2), Outcome::Failed);
        // Second in the order, answered on the first attempt: never reached.
        assert_eq!(with(&|s| s.position = 1), Outcome::Aborted);
        assert_eq!(
            with(&|s| {
                s.position = 1;
                s.attempts = 2
            }),
            done.outcome()
        );
        assert_eq!(with(&|s| s.complete = false), Outcome::Aborted);
        assert_eq!(
            with(&|s| {
                s.complete = false;
                s.went_silent = true
            }),
            Outcome::StreamIdle
        );
    }

    #[test]
    fn a_body_without_usage_reports_none() {
        let mut w = UsageWatch::default();
        w.feed(br#"data: {"choices":[{"delta":{"content":"hi"}}]}"#);
        w.feed(b"\n\ndata: [DONE]\n\n");
        assert_eq!((w.prompt_tokens, w.cached_tokens), (None, None));
    }
}
