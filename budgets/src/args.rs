//! The command line's shape, shared by the server and `status`: `--flag value` or `--flag=value`,
//! `-h`/`--help`, an unknown argument refused with the usage.

/// Calls `on(flag, value)` for each argument; `value()` takes the flag's value (inline after `=`
/// or the next argument). `on` answers `Ok(false)` for a flag it does not know.
pub fn each_flag(
    args: impl IntoIterator<Item = String>,
    usage: &str,
    mut on: impl FnMut(&str, &mut dyn FnMut() -> Result<String, String>) -> Result<bool, String>,
) -> Result<(), String> {
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        if name == "-h" || name == "--help" {
            return Err(usage.to_string());
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value\n{usage}"))
        };
        if !on(&name, &mut value)? {
            return Err(format!("unknown argument {name:?}\n{usage}"));
        }
    }
    Ok(())
}

/// A millisecond flag's value within `lo..=hi`.
pub fn millis(flag: &str, v: &str, lo: u64, hi: u64) -> Result<u64, String> {
    v.parse()
        .ok()
        .filter(|t| (lo..=hi).contains(t))
        .ok_or_else(|| format!("{flag} {v:?}: milliseconds, {lo} to {hi}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Vec<(String, String)>, String> {
        let mut seen = Vec::new();
        each_flag(args.iter().map(|s| s.to_string()), "USAGE", |f, v| {
            Ok(match f {
                "--a" => {
                    seen.push((f.to_string(), v()?));
                    true
                }
                "--b" => {
                    seen.push((f.to_string(), String::new()));
                    true
                }
                _ => false,
            })
        })?;
        Ok(seen)
    }

    #[test]
    fn values_inline_or_next_and_refusals() {
        assert_eq!(
            run(&["--a", "1", "--a=2", "--b"]).unwrap(),
            [("--a", "1"), ("--a", "2"), ("--b", "")].map(|(a, b)| (a.into(), b.into()))
        );
        assert_eq!(run(&["--a"]).unwrap_err(), "--a needs a value\nUSAGE");
        assert_eq!(
            run(&["--c"]).unwrap_err(),
            "unknown argument \"--c\"\nUSAGE"
        );
        assert_eq!(run(&["--help"]).unwrap_err(), "USAGE");
        assert_eq!(
            millis("--t", "70000", 1, 60000).unwrap_err(),
            "--t \"70000\": milliseconds, 1 to 60000"
        );
    }
}
