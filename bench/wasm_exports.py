"""Removes named exports from a WebAssembly module (binary format, export section id 7).

Envoy skips a per-request callback the module does not export, so a filter that never needs, say,
`proxy_on_response_body` is cheaper without that export. The code stays; only the export goes.
"""
from __future__ import annotations

from pathlib import Path

MAGIC = b"\0asm\x01\0\0\0"
EXPORT_SECTION = 7


def _uleb(b: bytes, i: int) -> tuple[int, int]:
    r = s = 0
    while True:
        x = b[i]
        i += 1
        r |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return r, i


def _enc(n: int) -> bytes:
    out = bytearray()
    while True:
        x, n = n & 0x7F, n >> 7
        out.append(x | (0x80 if n else 0))
        if not n:
            return bytes(out)


def drop(src: Path, dst: Path, names: list[str]) -> list[str]:
    """Writes src without the named exports to dst; returns the names actually removed."""
    b = Path(src).read_bytes()
    if b[:8] != MAGIC:
        raise ValueError(f"{src}: not a wasm module")
    out, i, removed = bytearray(b[:8]), 8, []
    while i < len(b):
        sid = b[i]
        size, j = _uleb(b, i + 1)
        body = b[j:j + size]
        if sid == EXPORT_SECTION:
            n, k = _uleb(body, 0)
            kept = []
            for _ in range(n):
                ln, k = _uleb(body, k)
                name = body[k:k + ln].decode()
                _, end = _uleb(body, k + ln + 1)  # kind byte, then index
                entry = body[k - len(_enc(ln)):end]
                k = end
                if name in names:
                    removed.append(name)
                else:
                    kept.append(entry)
            body = _enc(len(kept)) + b"".join(kept)
        out += bytes([sid]) + _enc(len(body)) + body
        i = j + size
    Path(dst).write_bytes(out)
    return removed
