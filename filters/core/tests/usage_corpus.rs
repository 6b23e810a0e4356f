//! Replays the committed `usage_stream` fuzz corpus and reproducers natively on every
//! `cargo test`: reading in pieces equals reading whole.

use std::path::Path;

#[test]
fn usage_stream_corpus_reads_the_same_in_pieces() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut seen = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join("usage_stream")) else {
            continue;
        };
        for e in entries.flatten() {
            let data = std::fs::read(e.path()).unwrap();
            router_core::budget::usage::split_invariance(&data)
                .unwrap_or_else(|why| panic!("{:?}: {why}", e.path()));
            seen += 1;
        }
    }
    assert!(seen >= 8, "the usage_stream corpus is missing");
}
