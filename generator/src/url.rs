//! External backend URLs and `HOST:PORT` arguments.

use std::net::IpAddr;

/// A parsed `http(s)://host[:port][/path]` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedUrl {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing `/` (empty for none).
    pub path: String,
}

impl ParsedUrl {
    pub fn host_is_ip(&self) -> bool {
        self.host.parse::<IpAddr>().is_ok()
    }
    /// Host header value: host, plus the port when it is not the scheme's default.
    pub fn authority(&self) -> String {
        let h = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if (self.https && self.port == 443) || (!self.https && self.port == 80) {
            h
        } else {
            format!("{h}:{}", self.port)
        }
    }
}

/// Parses an external backend URL. Credentials, query strings and fragments are refused.
pub fn parse_url(u: &str) -> Result<ParsedUrl, String> {
    let lower = u.to_ascii_lowercase();
    let (https, rest) = if lower.starts_with("https://") {
        (true, &u[8..])
    } else if lower.starts_with("http://") {
        (false, &u[7..])
    } else {
        return Err(format!("{u:?} must be an http:// or https:// URL"));
    };
    if rest.contains(['?', '#']) {
        return Err(format!("{u:?} must not have a query or fragment"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(format!(
            "{u:?} must not carry credentials; use credentialsSecretRef"
        ));
    }
    let (host, port) = split_host_port(authority).map_err(|e| format!("{u:?}: {e}"))?;
    let port = port.unwrap_or(if https { 443 } else { 80 });
    if path.contains(char::is_whitespace) || path.contains("//") {
        return Err(format!("{u:?} has an invalid path"));
    }
    Ok(ParsedUrl {
        https,
        host: host.to_ascii_lowercase(),
        port,
        path: path.trim_end_matches('/').to_string(),
    })
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(s: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']').ok_or("unclosed '['")?;
        let host = &rest[..end];
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err("unexpected text after ']'".into()),
        };
        (host.to_string(), port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("missing host".into());
    }
    if !host.contains(':')
        && !host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-' || c == b'_')
    {
        return Err(format!("{host:?} is not a valid host name"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|c| c.is_ascii_digit()) => Some(n),
            _ => return Err(format!("{p:?} is not a valid port")),
        },
    };
    Ok((host, port))
}

/// Parses `HOST:PORT` (port required).
pub fn parse_host_port(s: &str) -> Result<(String, u16), String> {
    match split_host_port(s)? {
        (h, Some(p)) => Ok((h, p)),
        (_, None) => Err(format!("{s:?} needs a port (HOST:PORT)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("http://litellm.llm.svc:4000").unwrap();
        assert_eq!(
            (u.https, u.host.as_str(), u.port, u.path.as_str()),
            (false, "litellm.llm.svc", 4000, "")
        );
        assert_eq!(u.authority(), "litellm.llm.svc:4000");
        let u = parse_url("https://api.openai.com/v1/").unwrap();
        assert_eq!(
            (u.https, u.port, u.path.as_str(), u.authority()),
            (true, 443, "/v1", "api.openai.com".to_string())
        );
        let u = parse_url("http://[::1]:8080/x").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.authority()),
            ("::1", 8080, "[::1]:8080".to_string())
        );
        for bad in [
            "ftp://x",
            "http://",
            "http://a:b",
            "http://u:p@h",
            "http://h/?q",
            "litellm:4000",
            "http://h:0",
            "http://h x",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
