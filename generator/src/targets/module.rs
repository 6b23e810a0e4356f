//! The filter modules every target loads or pins: their file names, where the workspace builds
//! them, and the model-router module's sha256 pin.

use std::path::{Path, PathBuf};

use crate::{Diagnostics, Problem};

/// The downstream routing filter.
pub const WASM_FILE: &str = "llmkube_model_router.wasm";
/// The upstream filter (per attempt: fail-closed guard, model rewrite, attempt marker).
pub const UPSTREAM_WASM_FILE: &str = "llmkube_upstream.wasm";

/// The workspace's release build output for wasm32-wasip1 (`$CARGO_TARGET_DIR` when the generator
/// was built with one set).
pub fn default_wasm_dir() -> PathBuf {
    let target = match option_env!("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target"),
    };
    target.join("wasm32-wasip1").join("release")
}

/// `p`, made absolute against the current directory.
pub fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}

/// The model-router module's sha256: `--wasm-sha256` (64 lowercase hex digits), else that of
/// the built file in `wasm_dir`.
pub fn pin_module(given: Option<&str>, wasm_dir: &Path, diags: &mut Diagnostics) -> Option<String> {
    if let Some(s) = given {
        let ok = s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        if !ok {
            diags.error(Problem::new(
                "options",
                "--wasm-sha256",
                format!("{s:?} must be 64 lowercase hex digits"),
            ));
            return None;
        }
        return Some(s.to_string());
    }
    let path = wasm_dir.join(WASM_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Some(sha256_hex(&bytes)),
        Err(e) => {
            diags.error(Problem::new(
                "options",
                "--wasm-sha256",
                format!("cannot read {} to pin its sha256 ({e}): build it (cargo build --release --target wasm32-wasip1 -p llmkube-model-router), point --wasm-dir at it, or pass --wasm-sha256", path.display()),
            ));
            None
        }
    }
}

/// Lowercase hex of the SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
