//! Model-name globs: `*` (any run of characters, `/` included, so `meta-llama/*` and `*` cover
//! org-qualified ids), `?` (one character), `[abc]`, `[a-z]`, `[!a-z]` / `[^a-z]`, and `\` to
//! escape. Patterns are compiled once at config load; matching is iterative with single-star
//! backtracking, so it is linear-ish in the model length and never recurses.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    tokens: Vec<Token>,
    /// No metacharacters: compare as a plain string.
    literal: Option<String>,
    /// The plain characters the pattern starts with: a model that does not start with them
    /// cannot match, and most models a rule sees do not (no per-character walk for those).
    prefix: String,
    /// The pattern is that prefix and one `*` (`qwen3-*`): starting with it is matching.
    prefix_star: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Char(char),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobError(pub String);

impl std::fmt::Display for GlobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Glob, GlobError> {
        let mut tokens = Vec::new();
        let mut chars = pattern.chars().peekable();
        let mut plain = true;
        while let Some(c) = chars.next() {
            match c {
                '*' => {
                    plain = false;
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                }
                '?' => {
                    plain = false;
                    tokens.push(Token::Any);
                }
                '\\' => {
                    plain = false;
                    let e = chars
                        .next()
                        .ok_or_else(|| GlobError(format!("pattern {pattern:?} ends with '\\'")))?;
                    tokens.push(Token::Char(e));
                }
                '[' => {
                    plain = false;
                    let negated = matches!(chars.peek(), Some('!' | '^'));
                    if negated {
                        chars.next();
                    }
                    let mut ranges = Vec::new();
                    let mut first = true;
                    loop {
                        let Some(mut lo) = chars.next() else {
                            return Err(GlobError(format!(
                                "pattern {pattern:?} has an unclosed '['"
                            )));
                        };
                        if lo == ']' && !first {
                            break;
                        }
                        first = false;
                        if lo == '\\' {
                            lo = chars.next().ok_or_else(|| {
                                GlobError(format!("pattern {pattern:?} has an unclosed '['"))
                            })?;
                        }
                        let mut hi = lo;
                        if chars.peek() == Some(&'-') {
                            let mut ahead = chars.clone();
                            ahead.next();
                            if let Some(&h) = ahead.peek() {
                                if h != ']' {
                                    chars.next();
                                    hi = chars.next().unwrap_or(lo);
                                    if hi == '\\' {
                                        hi = chars.next().ok_or_else(|| {
                                            GlobError(format!(
                                                "pattern {pattern:?} has an unclosed '['"
                                            ))
                                        })?;
                                    }
                                    if hi < lo {
                                        return Err(GlobError(format!(
                                            "pattern {pattern:?} has an empty range {lo}-{hi}"
                                        )));
                                    }
                                }
                            }
                        }
                        ranges.push((lo, hi));
                    }
                    tokens.push(Token::Class { negated, ranges });
                }
                c => tokens.push(Token::Char(c)),
            }
        }
        let prefix: String = tokens
            .iter()
            .map_while(|t| match t {
                Token::Char(c) => Some(*c),
                _ => None,
            })
            .collect();
        let rest = &tokens[prefix.chars().count()..];
        Ok(Glob {
            literal: plain.then(|| pattern.to_string()),
            prefix_star: rest == [Token::Star],
            prefix,
            tokens,
        })
    }

    pub fn matches(&self, s: &str) -> bool {
        if let Some(lit) = &self.literal {
            return lit == s;
        }
        if !s.starts_with(self.prefix.as_str()) {
            return false;
        }
        if self.prefix_star {
            return true;
        }
        self.walk(s)
    }

    /// The pattern's whole match, character by character.
    fn walk(&self, s: &str) -> bool {
        let text: Vec<char> = s.chars().collect();
        let toks = &self.tokens;
        let (mut t, mut p) = (0usize, 0usize);
        // Position after the last star, and the text index it is currently absorbing up to.
        let mut backtrack: Option<(usize, usize)> = None;
        while t < text.len() {
            if p < toks.len() {
                match &toks[p] {
                    Token::Star => {
                        backtrack = Some((p + 1, t));
                        p += 1;
                        continue;
                    }
                    tok if tok_matches(tok, text[t]) => {
                        p += 1;
                        t += 1;
                        continue;
                    }
                    _ => {}
                }
            }
            match backtrack {
                Some((bp, bt)) => {
                    backtrack = Some((bp, bt + 1));
                    p = bp;
                    t = bt + 1;
                }
                None => return false,
            }
        }
        toks[p..].iter().all(|tok| *tok == Token::Star)
    }
}

fn tok_matches(tok: &Token, c: char) -> bool {
    match tok {
        Token::Char(x) => *x == c,
        Token::Any => true,
        Token::Star => true,
        Token::Class { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Glob::new(p).unwrap().matches(s)
    }

    #[test]
    fn the_prefix_shortcuts_answer_as_the_walk() {
        let patterns = [
            "qwen3-*",
            "qwen3-*b",
            "*",
            "q*",
            "qw?n*",
            "\\*x*",
            "llama-[23]-*",
            "é*",
            "a*b*c",
        ];
        let models = [
            "",
            "q",
            "qwen3-",
            "qwen3-8b",
            "qwen2-8b",
            "qwen3-8bb",
            "*xy",
            "llama-3-70b",
            "éa",
            "aXbYc",
            "meta-llama/Llama-3.3-70B-Instruct",
        ];
        for p in patterns {
            let g = Glob::new(p).unwrap();
            for s in models {
                assert_eq!(g.matches(s), g.walk(s), "{p:?} against {s:?}");
            }
        }
        assert!(Glob::new("qwen3-*").unwrap().prefix_star);
        assert!(!Glob::new("qwen3-*b").unwrap().prefix_star);
    }

    #[test]
    fn literal_and_wildcards() {
        assert!(m("qwen3-8b", "qwen3-8b"));
        assert!(!m("qwen3-8b", "qwen3-8b2"));
        assert!(m("qwen3-*", "qwen3-8b"));
        assert!(m("qwen3-*", "qwen3-"));
        assert!(!m("qwen3-*", "qwen2-8b"));
        assert!(m("*", ""));
        assert!(m("*", "meta-llama/Llama-3-8B"));
        assert!(m("meta-llama/*", "meta-llama/Llama-3-8B"));
        assert!(m("*-70b", "llama-3-70b"));
        assert!(m("a*b*c", "aXXbYYbc"));
        assert!(!m("a*b*c", "aXXbYYb"));
        assert!(m("gpt-?", "gpt-5"));
        assert!(!m("gpt-?", "gpt-55"));
        assert!(m("**a", "bba"));
    }

    #[test]
    fn classes_and_escapes() {
        assert!(m("llama-[23]-*", "llama-3-70b"));
        assert!(!m("llama-[23]-*", "llama-4-70b"));
        assert!(m("v[0-9]", "v7"));
        assert!(!m("v[!0-9]", "v7"));
        assert!(m("v[^0-9]", "vx"));
        assert!(m("x[]]", "x]"));
        assert!(m("x[a-]", "x-"));
        assert!(m(r"lit\*", "lit*"));
        assert!(!m(r"lit\*", "litx"));
        assert!(m("日本*", "日本語"));
    }

    #[test]
    fn bad_patterns_are_errors() {
        assert!(Glob::new("x[ab").is_err());
        assert!(Glob::new("x\\").is_err());
        assert!(Glob::new("[z-a]").is_err());
    }

    #[test]
    fn pathological_patterns_stay_fast() {
        let p = format!("{}b", "*a".repeat(50));
        let s = "a".repeat(5000);
        assert!(!m(&p, &s));
    }
}
