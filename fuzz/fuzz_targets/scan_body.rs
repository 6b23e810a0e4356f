//! The body scanner against serde_json as an oracle: whatever it accepts is valid JSON whose
//! top-level `model` is exactly what serde_json reads; whatever serde_json accepts and it refuses
//! is refused for a documented reason.
#![no_main]
use libfuzzer_sys::fuzz_target;
use router_core::scan::{ScanError, Scanner};

fuzz_target!(|data: &[u8]| {
    let mut scanner = Scanner::new();
    let ours = scanner.scan(data);
    let theirs = serde_json::from_slice::<serde_json::Value>(data);
    match (&ours, &theirs) {
        (Ok(fields), Ok(value)) => {
            assert_eq!(value.get("model").and_then(|m| m.as_str()), Some(fields.model.as_ref()));
            assert_eq!(fields.stream, value.get("stream") == Some(&serde_json::Value::Bool(true)));
        }
        (Ok(_), Err(e)) => {
            // Known, harmless differences: serde_json stops at 128 levels (we allow 512) and
            // refuses numbers beyond f64 (valid JSON grammar, which is all routing needs).
            let e = e.to_string();
            assert!(
                e.contains("recursion limit") || e.contains("number out of range"),
                "we accepted what serde_json refused: {e}"
            );
        }
        (Err(ScanError::Invalid { .. }), Ok(_)) => panic!("refused valid JSON as invalid: {ours:?}"),
        (Err(_), _) => {}
    }
});
