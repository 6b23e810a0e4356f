//! Replays the committed fuzz corpora and crash reproducers (`fuzz/corpus`, `fuzz/regressions`)
//! natively on every `cargo test`, so an input that once broke a parser stays covered even where
//! cargo-fuzz cannot run.

use router_core::config::{PluginConfig, Tier};
use router_core::glob::Glob;
use router_core::router::{RequestHeaders, Router};
use router_core::scan::{ScanError, Scanner};
use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_file() {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn scan_body_corpus_agrees_with_serde_json() {
    let files = inputs("scan_body");
    assert!(files.len() >= 10, "the scan_body corpus is missing");
    let mut scanner = Scanner::new();
    for (path, data) in files {
        let ours = scanner.scan(&data);
        let theirs = serde_json::from_slice::<serde_json::Value>(&data);
        match (&ours, &theirs) {
            (Ok(f), Ok(v)) => assert_eq!(v["model"].as_str(), Some(f.model.as_str()), "{path:?}"),
            (Ok(_), Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains("recursion limit") || e.contains("number out of range"),
                    "{path:?}: {e}"
                );
            }
            (Err(ScanError::Invalid { .. }), Ok(_)) => {
                panic!("{path:?}: valid JSON refused as invalid")
            }
            _ => {}
        }
    }
}

#[test]
fn glob_corpus_never_panics() {
    for (_, data) in inputs("glob") {
        let text = String::from_utf8_lossy(&data);
        let (p, s) = text.split_once('\n').unwrap_or((&text, ""));
        if let Ok(g) = Glob::new(p) {
            g.matches(s);
        }
    }
}

#[test]
fn route_request_corpus_keeps_pii_local() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/route_request_router.json");
    let cfg: PluginConfig = serde_json::from_slice(&std::fs::read(root).unwrap()).unwrap();
    let router = Router::new(cfg).unwrap();
    let mut scanner = Scanner::new();
    let files = inputs("route_request");
    assert!(!files.is_empty());
    for (path, data) in files {
        let split = data.windows(2).position(|w| w == b"\n\n").unwrap_or(0);
        let (head, body) = data.split_at(split);
        let mut h = RequestHeaders::new();
        let mut sensitive = false;
        for line in head.split(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(line);
            if let Some((n, v)) = line.split_once(':') {
                let n = n.trim().to_ascii_lowercase();
                sensitive |= n == "x-llmkube-classification"
                    && v.split(',')
                        .any(|c| ["pii", "phi"].contains(&c.trim().to_ascii_lowercase().as_str()));
                h.push(n, v.to_string());
            }
        }
        let Ok(f) = scanner.scan(body.get(2..).unwrap_or(&[])) else {
            continue;
        };
        let mut n = 0u64;
        if let Ok(d) = router.decide(&f.model, &h, &mut || {
            n += 1;
            n
        }) {
            if sensitive {
                assert!(
                    d.order
                        .iter()
                        .all(|&b| router.backend(b).tier == Tier::Local),
                    "{path:?}"
                );
            }
        }
    }
}
