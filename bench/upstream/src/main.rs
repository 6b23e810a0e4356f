//! A tiny, fast fixed-response HTTP/1.1 upstream for the filter benchmark (std only).
//!
//! One thread per connection (Envoy opens only a handful), keep-alive, `Content-Length` and
//! `chunked` request bodies read fully and discarded, and a fixed chat-completion JSON answer.
//! It echoes what the benchmark needs to check that a request really went through a listener's
//! filters: `x-seen-bytes` (request body length it received) and `x-seen-backend` (the value of
//! `x-llmkube-backend`, or `-`).
//!
//! Usage: bench-upstream PORT   (prints "ready <port>" on stdout once listening)

use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};

const BODY: &[u8] = br#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind");
    println!("ready {}", listener.local_addr().unwrap().port());
    io::stdout().flush().ok();
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                std::thread::spawn(move || {
                    let _ = serve(s);
                });
            }
            Err(_) => continue,
        }
    }
}

fn serve(stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut out = stream.try_clone()?;
    let mut rd = BufReader::with_capacity(256 * 1024, stream);
    let mut line = String::new();
    let mut resp = Vec::with_capacity(1024);
    loop {
        // Request line + headers.
        let mut content_length: u64 = 0;
        let mut chunked = false;
        let mut close = false;
        let mut backend = String::from("-");
        let mut first = true;
        loop {
            line.clear();
            if rd.read_line(&mut line)? == 0 {
                return Ok(()); // peer closed
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if first {
                    continue;
                }
                break;
            }
            if first {
                first = false;
                continue;
            }
            if let Some((name, value)) = l.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = value.to_ascii_lowercase().contains("chunked");
                } else if name.eq_ignore_ascii_case("connection") {
                    close = value.eq_ignore_ascii_case("close");
                } else if name.eq_ignore_ascii_case("x-llmkube-backend") {
                    backend = value.to_string();
                }
            }
        }
        let seen = if chunked {
            read_chunked(&mut rd, &mut line)?
        } else {
            discard(&mut rd, content_length)?;
            content_length
        };
        resp.clear();
        write!(
            resp,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-seen-bytes: {}\r\nx-seen-backend: {}\r\n\r\n",
            BODY.len(),
            seen,
            backend
        )?;
        resp.extend_from_slice(BODY);
        out.write_all(&resp)?;
        if close {
            return Ok(());
        }
    }
}

fn discard<R: BufRead>(rd: &mut R, mut n: u64) -> io::Result<()> {
    while n > 0 {
        let buf = rd.fill_buf()?;
        if buf.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let take = (buf.len() as u64).min(n) as usize;
        rd.consume(take);
        n -= take as u64;
    }
    Ok(())
}

fn read_chunked<R: BufRead>(rd: &mut R, line: &mut String) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        line.clear();
        rd.read_line(line)?;
        let size_str = line.trim().split(';').next().unwrap_or("0");
        let size = u64::from_str_radix(size_str, 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                line.clear();
                if rd.read_line(line)? == 0 || line.trim().is_empty() {
                    return Ok(total);
                }
            }
        }
        discard(rd, size)?;
        total += size;
        line.clear();
        rd.read_line(line)?; // CRLF after the chunk
    }
}

