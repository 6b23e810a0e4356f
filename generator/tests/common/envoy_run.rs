//! Running a real Envoy in tests: the binary (`$ENVOY_BIN`, else `<repo>/.venv/bin/envoy`; a
//! missing Envoy fails the test), the model-router module (`$LLMKUBE_WASM_DIR`, else built by
//! cargo, a no-op when fresh), and `envoy --mode validate` on a config.

use llmkube_gen::targets::envoy::WASM_FILE;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn envoy_bin() -> PathBuf {
    let p = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/envoy"));
    assert!(
        p.is_file(),
        "Envoy not found at {} (set ENVOY_BIN or run scripts/setup.sh)",
        p.display()
    );
    p
}

pub fn model_router_dir() -> PathBuf {
    {
        if let Some(d) = std::env::var_os("LLMKUBE_WASM_DIR") {
            let d = PathBuf::from(d);
            assert!(
                d.join(WASM_FILE).is_file(),
                "LLMKUBE_WASM_DIR has no {WASM_FILE}"
            );
            return d;
        }
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(t) if !t.is_empty() => {
                let t = PathBuf::from(t);
                if t.is_absolute() {
                    t
                } else {
                    repo_root().join(t)
                }
            }
            _ => repo_root().join("target"),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(repo_root())
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip1",
                "-p",
                "llmkube-model-router",
            ])
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .expect("running cargo");
        assert!(
            out.status.success(),
            "building the wasm filter failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let d = target.join("wasm32-wasip1/release");
        assert!(
            d.join(WASM_FILE).is_file(),
            "{} missing after the build",
            d.join(WASM_FILE).display()
        );
        d
    }
}

pub fn base_id() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    (std::process::id() % 100_000) * 20 + N.fetch_add(1, Ordering::SeqCst)
}

/// Runs `envoy --mode validate` on `content`; (accepted, report).
pub fn envoy_validate(file_name: &str, content: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("llmkube-gen-envoy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(file_name);
    std::fs::write(&file, content).unwrap();
    let o = Command::new(envoy_bin())
        .args(["--mode", "validate", "-c"])
        .arg(&file)
        .args(["--base-id", &base_id().to_string(), "--log-level", "warn"])
        .output()
        .expect("running envoy");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let report = format!(
        "envoy --mode validate on {}:\n{stdout}\n{}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success() && stdout.contains("OK"), report)
}
