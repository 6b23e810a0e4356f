//! The body scanner against serde_json as an oracle: whatever it accepts is valid JSON whose
//! top-level `model` is exactly what serde_json reads; whatever serde_json accepts and it refuses
//! is refused for a documented reason. And the body fed in pieces (cut where its own bytes say)
//! gives exactly the whole-body answer, an early error included.
#![no_main]
use libfuzzer_sys::fuzz_target;
use router_core::scan::{ScanError, Scanner};

fuzz_target!(|data: &[u8]| {
    let mut scanner = Scanner::new();
    let ours = scanner.scan(data);
    let whole = ours
        .clone()
        .map(|f| (f.model, f.stream, f.spans));
    let mut cut = 0usize;
    let mut pieces = Scanner::new();
    pieces.begin();
    pieces.look_at_every_piece();
    let mut seed = data
        .iter()
        .fold(0x9E37_79B9u32, |h, &b| h.rotate_left(5) ^ b as u32);
    let chunked = loop {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        cut += 1 + (seed % 9) as usize;
        if cut >= data.len() {
            break pieces.resume(data, true).map(|f| {
                let f = f.expect("a whole body always finishes");
                (f.model, f.stream, f.spans)
            });
        }
        match pieces.resume(&data[..cut], false) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("finished on an incomplete piece"),
            Err(e) => break Err(e),
        }
    };
    assert_eq!(chunked, whole, "pieces disagree with the whole body");
    // As the filter feeds it: a window that keeps only the bytes from `needed_from` on.
    let (mut window, mut base, mut seen) = (Vec::new(), 0usize, 0usize);
    pieces.begin();
    let windowed = loop {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let k = (seen + 1 + (seed % 9) as usize).min(data.len());
        window.extend_from_slice(&data[seen..k]);
        seen = k;
        let complete = k == data.len();
        match pieces.resume_window(&window, base, complete) {
            Ok(Some(f)) => {
                assert!(complete, "finished on an incomplete piece");
                break Ok((f.model, f.stream, f.spans));
            }
            Ok(None) => assert!(!complete, "a whole body always finishes"),
            Err(e) => break Err(e),
        }
        let keep = pieces.needed_from();
        assert!(keep >= base && keep <= seen);
        window.drain(..keep - base);
        base = keep;
    };
    assert_eq!(windowed, whole, "a window disagrees with the whole body");
    let theirs = serde_json::from_slice::<serde_json::Value>(data);
    match (&ours, &theirs) {
        (Ok(fields), Ok(value)) => {
            assert_eq!(
                value.get("model").and_then(|m| m.as_str()),
                Some(fields.model.as_str())
            );
            assert_eq!(
                fields.stream,
                value.get("stream") == Some(&serde_json::Value::Bool(true))
            );
        }
        (Ok(_), Err(e)) => {
            // Known, harmless differences: serde_json stops at 128 levels (we allow 512); both
            // refuse numbers beyond f64, but serde_json's fast float parse may round a literal
            // within an ulp of f64::MAX the other way.
            let e = e.to_string();
            assert!(
                e.contains("recursion limit") || e.contains("number out of range"),
                "we accepted what serde_json refused: {e}"
            );
        }
        (Err(ScanError::Invalid { .. }), Ok(_)) => {
            panic!("refused valid JSON as invalid: {ours:?}")
        }
        (Err(_), _) => {}
    }
});
