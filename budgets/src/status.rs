//! `llmkube-budgets status --service HOST:PORT --router NAMESPACE/NAME [--json]`: prints a
//! ModelRouter's `status.budgetUtilization` as a running service keeps it (the same ledgers every
//! gateway replica charges), as a table or as the seed's JSON.
//!
//! A blocking HTTP/1.1 GET over one connection: the command runs once and exits, so it needs
//! neither the runtime nor a client library.

use router_core::budget::protocol::Utilization;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

pub const USAGE: &str =
    "usage: llmkube-budgets status --service HOST:PORT --router NAMESPACE/NAME [--json] [--timeout-ms MS]";

/// Longest answer read: status of many team budgets stays far below this.
const MAX_ANSWER: u64 = 8 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusFlags {
    pub service: String,
    pub router: String,
    pub json: bool,
    pub timeout_ms: u64,
}

impl StatusFlags {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<StatusFlags, String> {
        let (mut service, mut router, mut json, mut timeout_ms) = (None, None, false, 2000);
        crate::args::each_flag(args, USAGE, |flag, value| {
            match flag {
                "--service" => service = Some(value()?),
                "--router" => router = Some(value()?),
                "--json" => json = true,
                "--timeout-ms" => timeout_ms = crate::args::millis(flag, &value()?, 1, 60_000)?,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        let service = service.ok_or_else(|| format!("--service is required\n{USAGE}"))?;
        let router = router.ok_or_else(|| format!("--router is required\n{USAGE}"))?;
        if service
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(format!("--service {service:?}: not HOST:PORT"));
        }
        if router.is_empty() || router.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(format!(
                "--router {router:?}: NAMESPACE/NAME, printable ASCII"
            ));
        }
        Ok(StatusFlags {
            service,
            router,
            json,
            timeout_ms,
        })
    }
}

/// Asks the service and renders its answer; `Err` says what went wrong (exit 1).
pub fn run(flags: &StatusFlags) -> Result<String, String> {
    let body = get(
        &flags.service,
        &format!("/v1/status?router={}", percent_encode(&flags.router)),
        Duration::from_millis(flags.timeout_ms),
    )?;
    let entries = parse(&body)?;
    Ok(if flags.json {
        let status = serde_json::json!({ "budgetUtilization": entries });
        serde_json::to_string_pretty(&status).unwrap_or_default() + "\n"
    } else {
        render(&flags.router, &entries)
    })
}

/// The `budgetUtilization` list of a status answer.
pub fn parse(body: &[u8]) -> Result<Vec<Utilization>, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Answer {
        budget_utilization: Vec<Utilization>,
    }
    serde_json::from_slice::<Answer>(body)
        .map(|a| a.budget_utilization)
        .map_err(|e| format!("the service's status answer is not readable: {e}"))
}

/// One line per budget, and one per team under a team budget, with what is held in flight.
pub fn render(router: &str, entries: &[Utilization]) -> String {
    let mut rows = vec![[
        "BUDGET".to_string(),
        "TEAM".into(),
        "TOKENS USED".into(),
        "USD USED".into(),
        "UTILIZATION".into(),
        "RESERVED TOKENS".into(),
        "RESERVED USD".into(),
    ]];
    let row = |u: &Utilization, name: &str| {
        [
            name.to_string(),
            u.team.clone().unwrap_or_else(|| "-".into()),
            u.tokens_used.to_string(),
            u.usd_used.clone(),
            u.utilization.clone(),
            u.tokens_reserved.to_string(),
            u.usd_reserved.clone(),
        ]
    };
    for u in entries {
        if u.teams.is_empty() {
            rows.push(row(u, &u.name));
        } else {
            rows.extend(u.teams.iter().map(|t| row(t, &u.name)));
        }
    }
    let mut widths = [0usize; 7];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = format!("status.budgetUtilization of {router}:\n");
    if entries.is_empty() {
        out.push_str("  (no budget has been charged yet)\n");
        return out;
    }
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(&format!("  {}\n", cells.join("  ").trim_end()));
    }
    out
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One GET; the body of a 200, else the status and the service's error message.
fn get(service: &str, path: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    let unreachable = |e: std::io::Error| format!("llmkube-budgets at {service}: {e}");
    let addr = service
        .to_socket_addrs()
        .map_err(unreachable)?
        .next()
        .ok_or_else(|| format!("llmkube-budgets at {service}: no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(unreachable)?;
    s.set_read_timeout(Some(timeout)).map_err(unreachable)?;
    s.set_write_timeout(Some(timeout)).map_err(unreachable)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {service}\r\nconnection: close\r\n\r\n"
    )
    .map_err(unreachable)?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER)
        .read_to_end(&mut raw)
        .map_err(unreachable)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("llmkube-budgets at {service}: no HTTP answer"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let body = raw[split + 4..].to_vec();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(format!(
            "llmkube-budgets at {service}: chunked answers are not read here"
        ));
    }
    if status != 200 {
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_default();
        return Err(format!(
            "llmkube-budgets at {service} answered {status}: {message}"
        ));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<StatusFlags, String> {
        StatusFlags::parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_are_checked_and_named() {
        let f = args(&["--service", "127.0.0.1:8080", "--router=ns/r", "--json"]).unwrap();
        assert_eq!(
            (f.service.as_str(), f.router.as_str(), f.json),
            ("127.0.0.1:8080", "ns/r", true)
        );
        assert!(args(&["--router", "ns/r"])
            .unwrap_err()
            .contains("--service is required"));
        assert!(args(&["--service", "x"])
            .unwrap_err()
            .contains("--router is required"));
        assert!(args(&["--service", "host", "--router", "r"])
            .unwrap_err()
            .contains("--service \"host\""));
        assert!(args(&["--service", "h:1", "--router", "a b"])
            .unwrap_err()
            .contains("--router"));
        assert!(args(&["--bogus"]).unwrap_err().contains("unknown argument"));
        assert!(args(&["--service", "h:1", "--router", "r", "--timeout-ms", "0"]).is_err());
    }

    #[test]
    fn renders_budgets_and_their_teams() {
        let body = br#"{"budgetUtilization":[
            {"name":"all","tokensUsed":40,"usdUsed":"0.0","utilization":"0.4","tokensReserved":10,"usdReserved":"0.0"},
            {"name":"teams","tokensUsed":5,"usdUsed":"0.25","utilization":"0.5","team":"beta","tokensReserved":0,"usdReserved":"0.0",
             "teams":[{"name":"teams","tokensUsed":1,"usdUsed":"0.05","utilization":"0.1","team":"alpha","tokensReserved":0,"usdReserved":"0.0"},
                      {"name":"teams","tokensUsed":5,"usdUsed":"0.25","utilization":"0.5","team":"beta","tokensReserved":0,"usdReserved":"0.0"}]}]}"#;
        let entries = parse(body).unwrap();
        let out = render("ns/r", &entries);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 5, "{out}");
        assert!(lines[1].starts_with("  BUDGET"));
        let cells = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[2]),
            ["all", "-", "40", "0.0", "0.4", "10", "0.0"]
        );
        assert_eq!(cells(lines[3])[..5], ["teams", "alpha", "1", "0.05", "0.1"]);
        assert_eq!(cells(lines[4])[1], "beta");
        assert!(render("ns/r", &[]).contains("no budget has been charged yet"));
        assert!(parse(b"{}").is_err());
        assert_eq!(percent_encode("ns/r x&"), "ns/r%20x%26");
    }
}
