//! Golden files: `tests/golden/<case>/<file>` holds the expected output. `UPDATE_GOLDEN=1`
//! rewrites them from the current output (review the diff before committing).

use std::path::PathBuf;

pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

/// Compares `actual` with `tests/golden/<case>/<file>`, or writes it under `UPDATE_GOLDEN=1`.
/// Returns a description of the mismatch (so one test can check every case before failing).
pub fn check(case: &str, file: &str, actual: &str) -> Result<(), String> {
    let path = golden_dir().join(case).join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return Ok(());
    }
    let expected = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    })?;
    if expected == actual {
        return Ok(());
    }
    let line = expected
        .lines()
        .zip(actual.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
    Err(format!(
        "{} differs from the output at line {} (expected {:?}, got {:?}); rerun with UPDATE_GOLDEN=1 if the change is intended",
        path.display(),
        line + 1,
        expected.lines().nth(line).unwrap_or("<end>"),
        actual.lines().nth(line).unwrap_or("<end>"),
    ))
}
