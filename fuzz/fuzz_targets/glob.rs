//! Glob compilation and matching never panic, and agree with a naive backtracking reference.
#![no_main]
use libfuzzer_sys::fuzz_target;
use router_core::glob::Glob;

fn reference(p: &[char], s: &[char]) -> bool {
    // Only for patterns without classes/escapes: '*' and '?' and literals.
    match p.first() {
        None => s.is_empty(),
        Some('*') => (0..=s.len()).any(|k| reference(&p[1..], &s[k..])),
        Some('?') => !s.is_empty() && reference(&p[1..], &s[1..]),
        Some(c) => s.first() == Some(c) && reference(&p[1..], &s[1..]),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (pattern, subject) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(glob) = Glob::new(pattern) else { return };
    let got = glob.matches(subject);
    let simple = !pattern.contains(['[', '\\']);
    if simple && pattern.len() <= 12 && subject.len() <= 24 {
        let p: Vec<char> = pattern.chars().collect();
        let s: Vec<char> = subject.chars().collect();
        assert_eq!(got, reference(&p, &s), "{pattern:?} vs {subject:?}");
    }
});
