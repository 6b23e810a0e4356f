//! The host's header-map serialisation is decoded without panicking, and whatever decodes
//! re-encodes to bytes that decode to the same pairs.
#![no_main]
use filter_edge::{decode_pairs, encode_pairs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(pairs) = decode_pairs(data) else { return };
    let strs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    let borrowed: Vec<(&str, &str)> = strs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let again = decode_pairs(&encode_pairs(&borrowed)).expect("re-encoded map decodes");
    assert_eq!(again.len(), pairs.len());
});
