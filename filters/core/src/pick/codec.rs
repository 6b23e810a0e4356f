//! Byte forms of the picking state, so it can live in proxy-wasm shared data (one copy for every
//! worker) and be read back by any worker or a newer build.
//!
//! Every value starts with a 4-byte header: `L`, `P`, a kind byte and a version byte. A reader
//! refuses (returns `None` for) another kind, another version, a length that does not match the
//! counts it announces, or counts beyond the bounds the live structures have, so a foreign or
//! truncated value is treated as absent, never trusted. All integers are little-endian.
//!
//! - table (kind `T`, v2): capacity u32, limit u32, count u32, then `count` block hashes u64,
//!   most recently sent first. 12 + 8 × count bytes after the header.
//! - loads (kind `L`, v2): pods u16, then per pod [`BUCKETS`] × (epoch u64, requests u32, work
//!   u64) and the gauges: flag u8, waiting f64, running f64, kv_usage f64, at u64, computed
//!   tokens f64, cache tokens f64 (NaN: not reported).
//! - sessions (kind `S`, v2): count u32, then count × (key u64, pod u16, last u64).

use super::load::{Bucket, EngineMetrics, PodLoad, BUCKETS};
use super::sent_blocks::{BlockTable, MAX_CAPACITY};
use super::session::{Sessions, MAX_SESSIONS};
use super::MAX_PODS;

/// 2: the loads' gauges carry the engine's computed-token counter; 3: and its cache capacity.
pub const VERSION: u8 = 3;
const TABLE: u8 = b'T';
const LOADS: u8 = b'L';
const SESSIONS: u8 = b'S';

fn header(kind: u8, out: &mut Vec<u8>) {
    out.extend_from_slice(&[b'L', b'P', kind, VERSION]);
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn open(b: &'a [u8], kind: u8) -> Option<Self> {
        match b {
            [b'L', b'P', k, VERSION, rest @ ..] if *k == kind => Some(Reader { b: rest }),
            _ => None,
        }
    }
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (a, rest) = self.b.split_first_chunk::<N>()?;
        self.b = rest;
        Some(*a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|a| a[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn f64(&mut self) -> Option<f64> {
        self.take()
            .map(f64::from_le_bytes)
            .filter(|v| v.is_finite() && *v >= 0.0)
    }
    fn rest_is(&self, n: usize) -> bool {
        self.b.len() == n
    }
}

pub fn encode_table(t: &BlockTable) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 8 * t.len());
    header(TABLE, &mut out);
    out.extend_from_slice(&(t.capacity() as u32).to_le_bytes());
    out.extend_from_slice(&(t.limit() as u32).to_le_bytes());
    out.extend_from_slice(&(t.len() as u32).to_le_bytes());
    for k in t.iter_recent() {
        out.extend_from_slice(&k.to_le_bytes());
    }
    out
}

pub fn decode_table(b: &[u8]) -> Option<BlockTable> {
    let mut r = Reader::open(b, TABLE)?;
    let cap = r.u32()? as usize;
    let limit = r.u32()? as usize;
    let count = r.u32()? as usize;
    if cap == 0 || cap > MAX_CAPACITY || limit > cap || count > limit || !r.rest_is(count * 8) {
        return None;
    }
    let mut t = BlockTable::new(cap);
    t.set_limit(limit);
    let keys: Vec<u64> =
        r.b.chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect();
    // Oldest first, so the first key ends most recent.
    for &k in keys.iter().rev() {
        t.touch(k);
    }
    Some(t)
}

pub fn encode_loads(loads: &[PodLoad]) -> Vec<u8> {
    let mut out = Vec::new();
    header(LOADS, &mut out);
    let n = loads.len().min(MAX_PODS);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    for l in &loads[..n] {
        for b in &l.buckets {
            out.extend_from_slice(&b.epoch.to_le_bytes());
            out.extend_from_slice(&b.requests.to_le_bytes());
            out.extend_from_slice(&b.work.to_le_bytes());
        }
        let m = l.metrics.unwrap_or_default();
        out.push(l.metrics.is_some() as u8);
        for v in [m.waiting, m.running, m.kv_usage] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&m.at_ns.to_le_bytes());
        out.extend_from_slice(&m.computed_tokens.unwrap_or(f64::NAN).to_le_bytes());
        out.extend_from_slice(&m.cache_tokens.unwrap_or(f64::NAN).to_le_bytes());
    }
    out
}

const LOAD_BYTES: usize = BUCKETS * 20 + 1 + 48;

pub fn decode_loads(b: &[u8], pods: usize) -> Option<Vec<PodLoad>> {
    let mut r = Reader::open(b, LOADS)?;
    let n = r.u16()? as usize;
    if n != pods || n > MAX_PODS || !r.rest_is(n * LOAD_BYTES) {
        return None;
    }
    let mut loads = Vec::with_capacity(n);
    for _ in 0..n {
        let mut l = PodLoad::default();
        for b in l.buckets.iter_mut() {
            *b = Bucket {
                epoch: r.u64()?,
                requests: r.u32()?,
                work: r.u64()?,
            };
        }
        let has = r.u8()?;
        let m = EngineMetrics {
            waiting: r.f64()?,
            running: r.f64()?,
            kv_usage: r.f64()?,
            at_ns: r.u64()?,
            computed_tokens: optional(r.u64()?)?,
            cache_tokens: optional(r.u64()?)?,
        };
        l.metrics = (has == 1).then_some(m);
        loads.push(l);
    }
    Some(loads)
}

/// An optional counter's bits: NaN is "not reported"; anything else must be a finite
/// non-negative number (`None`: refuse the value).
fn optional(bits: u64) -> Option<Option<f64>> {
    match f64::from_bits(bits) {
        c if c.is_nan() => Some(None),
        c => Some(c).filter(|c| c.is_finite() && *c >= 0.0).map(Some),
    }
}

pub fn encode_sessions(s: &Sessions) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 18 * s.len());
    header(SESSIONS, &mut out);
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    for (k, b) in s.iter() {
        out.extend_from_slice(&k.to_le_bytes());
        out.extend_from_slice(&b.pod.to_le_bytes());
        out.extend_from_slice(&b.last_ns.to_le_bytes());
    }
    out
}

/// Sessions naming a pod at or beyond `pods` are dropped (another configuration's).
pub fn decode_sessions(b: &[u8], pods: usize) -> Option<Sessions> {
    let mut r = Reader::open(b, SESSIONS)?;
    let n = r.u32()? as usize;
    if n > MAX_SESSIONS || !r.rest_is(n * 18) {
        return None;
    }
    let mut s = Sessions::new(MAX_SESSIONS);
    for _ in 0..n {
        let (k, pod, last) = (r.u64()?, r.u16()?, r.u64()?);
        if (pod as usize) < pods {
            s.bind(k, pod, last);
        }
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_in_recency_order() {
        let mut t = BlockTable::new(1024);
        t.record(&[1, 2, 3]);
        t.record(&[7, 8]);
        t.set_limit(900);
        let raw = encode_table(&t);
        assert_eq!(raw.len(), 16 + 8 * 5);
        let u = decode_table(&raw).unwrap();
        assert_eq!(
            u.iter_recent().collect::<Vec<_>>(),
            t.iter_recent().collect::<Vec<_>>()
        );
        assert_eq!((u.capacity(), u.limit()), (1024, 900));
    }

    #[test]
    fn foreign_truncated_or_oversized_values_are_refused() {
        let mut t = BlockTable::new(1024);
        t.record(&[1, 2, 3]);
        let raw = encode_table(&t);
        assert!(decode_table(&raw[..raw.len() - 1]).is_none());
        let mut v2 = raw.clone();
        v2[3] = VERSION + 1;
        assert!(decode_table(&v2).is_none(), "another version");
        let mut kind = raw.clone();
        kind[2] = b'S';
        assert!(decode_table(&kind).is_none());
        let mut huge = raw.clone();
        huge[4..8].copy_from_slice(&(MAX_CAPACITY as u32 + 1).to_le_bytes());
        assert!(decode_table(&huge).is_none());
        let mut lie = raw.clone();
        lie[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_table(&lie).is_none());
        assert!(decode_table(b"").is_none());
        assert!(decode_loads(b"LPL\x02", 0).is_none());
        assert!(decode_sessions(b"LPS\x02\x05\x00\x00\x00", 3).is_none());
    }

    #[test]
    fn loads_and_sessions_round_trip() {
        let mut loads = vec![PodLoad::default(); 3];
        loads[1].acquire(4, 900);
        loads[2].metrics = Some(EngineMetrics {
            waiting: 2.0,
            running: 5.0,
            kv_usage: 0.5,
            computed_tokens: Some(640.0),
            cache_tokens: Some(4096.0),
            at_ns: 77,
        });
        let raw = encode_loads(&loads);
        assert_eq!(decode_loads(&raw, 3).unwrap(), loads);
        assert!(decode_loads(&raw, 4).is_none(), "another pod count");

        let mut s = Sessions::new(MAX_SESSIONS);
        s.bind(11, 2, 100);
        s.bind(12, 5, 200);
        let raw = encode_sessions(&s);
        let back = decode_sessions(&raw, 3).unwrap();
        assert_eq!(back.get(11, 100, 10), Some(2));
        assert_eq!(back.get(12, 200, 10), None, "pod 5 is not configured");
    }
}
