//! What one worker's picker did, for every other worker's copy to do too.
//!
//! Each Envoy worker runs its own VM with its own [`Picker`]. Writing a whole picker (a 352 KiB
//! table per pod) to shared data per request would cost far more than the pick, so instead
//! every change is an [`Event`] of a few dozen bytes plus 8 bytes per prompt block. The worker
//! that picks applies it at once; the others apply it from their queue before their next pick.
//! Every copy then holds the same loads, tables, sessions and quarantines, up to the events
//! still in flight between two picks on different workers at the same instant.

use super::load::{EngineMetrics, Ticket};
use super::{blocks, Outcome, Picker, Prompt};

/// One change to a backend's picking state.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A request was charged to `pod`: its uncached work, its blocks recorded in the pod's
    /// table and its session bound there.
    Charged {
        pod: u16,
        epoch: u64,
        work: u64,
        session: Option<u64>,
        at_ns: u64,
        blocks: Vec<u64>,
    },
    /// That request ended (the ticket's fields and how it ended).
    Released {
        pod: u16,
        epoch: u64,
        work: u64,
        prompt_bytes: u64,
        predicted: u64,
        outcome: Outcome,
        at_ns: u64,
    },
    /// The engine's gauges for `pod`, as scraped.
    Metrics { pod: u16, metrics: EngineMetrics },
}

impl Picker {
    /// The event that repeats `ticket`'s pick on another copy (call right after [`Picker::pick`]).
    pub fn charged_event(
        &self,
        ticket: &Ticket,
        prompt: &Prompt,
        session: Option<u64>,
        now: u64,
    ) -> Event {
        let records = self.prefix().is_some();
        Event::Charged {
            pod: ticket.pod,
            epoch: ticket.epoch,
            work: ticket.work,
            session: session.filter(|_| self.cfg.session.is_some()),
            at_ns: now,
            blocks: if records {
                prompt.blocks.clone()
            } else {
                Vec::new()
            },
        }
    }

    /// The event that repeats releasing `ticket` (call just before [`Picker::release`]).
    pub fn released_event(ticket: &Ticket, outcome: Outcome, now: u64) -> Event {
        Event::Released {
            pod: ticket.pod,
            epoch: ticket.epoch,
            work: ticket.work,
            prompt_bytes: ticket.prompt_bytes as u64,
            predicted: ticket.predicted as u64,
            outcome,
            at_ns: now,
        }
    }

    /// Does what another copy did. Events naming a pod this copy does not have are ignored.
    pub fn apply(&mut self, event: &Event) {
        match *event {
            Event::Charged {
                pod,
                epoch,
                work,
                session,
                at_ns,
                ref blocks,
            } => {
                let i = pod as usize;
                let Some(l) = self.loads.get_mut(i) else {
                    return;
                };
                l.acquire(epoch, work);
                l.sent(at_ns, work, self.cfg.recent_half_life_ns);
                if self.prefix().is_some() {
                    self.tables[i].record(blocks);
                }
                if let Some(k) = session.filter(|_| self.cfg.session.is_some()) {
                    self.sessions.bind(k, pod, at_ns);
                }
            }
            Event::Released {
                pod,
                epoch,
                work,
                prompt_bytes,
                predicted,
                outcome,
                at_ns,
            } => {
                let t = Ticket {
                    pod,
                    epoch,
                    work,
                    prompt_bytes: prompt_bytes.min(usize::MAX as u64) as usize,
                    predicted: predicted.min(usize::MAX as u64) as usize,
                };
                self.release(t, outcome, at_ns);
            }
            Event::Metrics { pod, metrics } => self.set_metrics(pod as usize, metrics),
        }
    }
}

const MAGIC: [u8; 2] = *b"LE";
/// 2: `Metrics` carries the engine's computed-token counter. 5: `Charged`'s flags byte has
/// only the session bit.
const VERSION: u8 = 5;

/// `backend` (an index into the router's backends) and the event, as bytes.
pub fn encode(backend: u16, e: &Event) -> Vec<u8> {
    let mut w = Vec::with_capacity(64);
    w.extend_from_slice(&MAGIC);
    w.push(VERSION);
    w.extend_from_slice(&backend.to_le_bytes());
    let u64s = |w: &mut Vec<u8>, vs: &[u64]| {
        for v in vs {
            w.extend_from_slice(&v.to_le_bytes());
        }
    };
    match e {
        Event::Charged {
            pod,
            epoch,
            work,
            session,
            at_ns,
            blocks,
        } => {
            w.push(b'C');
            w.extend_from_slice(&pod.to_le_bytes());
            w.push(session.is_some() as u8);
            u64s(&mut w, &[*epoch, *work, session.unwrap_or(0), *at_ns]);
            w.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
            u64s(&mut w, blocks);
        }
        Event::Released {
            pod,
            epoch,
            work,
            prompt_bytes,
            predicted,
            outcome,
            at_ns,
        } => {
            w.push(b'R');
            w.extend_from_slice(&pod.to_le_bytes());
            let (kind, p, c) = match *outcome {
                Outcome::Done {
                    prompt_tokens,
                    cached_tokens,
                } => (
                    (prompt_tokens.is_some() as u8) << 4 | (cached_tokens.is_some() as u8) << 5,
                    prompt_tokens.unwrap_or(0),
                    cached_tokens.unwrap_or(0),
                ),
                Outcome::Failed => (1, 0, 0),
                Outcome::StreamIdle => (2, 0, 0),
                Outcome::Aborted => (3, 0, 0),
            };
            w.push(kind);
            u64s(
                &mut w,
                &[*epoch, *work, *prompt_bytes, *predicted, *at_ns, p, c],
            );
        }
        Event::Metrics { pod, metrics } => {
            w.push(b'M');
            w.extend_from_slice(&pod.to_le_bytes());
            u64s(
                &mut w,
                &[
                    metrics.waiting.to_bits(),
                    metrics.running.to_bits(),
                    metrics.kv_usage.to_bits(),
                    metrics.at_ns,
                    // NaN's bits, never a valid count, say "not reported".
                    metrics.computed_tokens.unwrap_or(f64::NAN).to_bits(),
                    metrics.cache_tokens.unwrap_or(f64::NAN).to_bits(),
                ],
            );
        }
    }
    w
}

/// Reads bytes from [`encode`]; `None` for anything else (another version, a short or long
/// value, more blocks than a prompt can have, a gauge that is not a finite non-negative number).
pub fn decode(raw: &[u8]) -> Option<(u16, Event)> {
    let mut r = Reader(raw);
    if r.take(2)? != MAGIC || r.u8()? != VERSION {
        return None;
    }
    let backend = r.u16()?;
    let kind = r.u8()?;
    let pod = r.u16()?;
    let e = match kind {
        b'C' => {
            let flags = r.u8()?;
            if flags > 1 {
                return None;
            }
            let has_session = flags == 1;
            let (epoch, work, session, at_ns) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let n = r.u32()? as usize;
            if n > blocks::MAX_BLOCKS || r.0.len() != n * 8 {
                return None;
            }
            let blocks = (0..n).map(|_| r.u64()).collect::<Option<Vec<u64>>>()?;
            Event::Charged {
                pod,
                epoch,
                work,
                session: has_session.then_some(session),
                at_ns,
                blocks,
            }
        }
        b'R' => {
            let k = r.u8()?;
            let v: Vec<u64> = (0..7).map(|_| r.u64()).collect::<Option<_>>()?;
            let outcome = match k & 0x0f {
                0 => Outcome::Done {
                    prompt_tokens: (k & 0x10 != 0).then_some(v[5]),
                    cached_tokens: (k & 0x20 != 0).then_some(v[6]),
                },
                1 => Outcome::Failed,
                2 => Outcome::StreamIdle,
                3 => Outcome::Aborted,
                _ => return None,
            };
            Event::Released {
                pod,
                epoch: v[0],
                work: v[1],
                prompt_bytes: v[2],
                predicted: v[3],
                outcome,
                at_ns: v[4],
            }
        }
        b'M' => {
            let gauge =
                |bits: u64| Some(f64::from_bits(bits)).filter(|g| g.is_finite() && *g >= 0.0);
            let metrics = EngineMetrics {
                waiting: gauge(r.u64()?)?,
                running: gauge(r.u64()?)?,
                kv_usage: gauge(r.u64()?)?,
                at_ns: r.u64()?,
                computed_tokens: match f64::from_bits(r.u64()?) {
                    c if c.is_nan() => None,
                    c => Some(gauge(c.to_bits())?),
                },
                cache_tokens: match f64::from_bits(r.u64()?) {
                    c if c.is_nan() => None,
                    c => Some(gauge(c.to_bits())?),
                },
            };
            Event::Metrics { pod, metrics }
        }
        _ => return None,
    };
    r.0.is_empty().then_some((backend, e))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pick::{hash_prompt, Choice, Config, Request};

    fn prompt(text: &[u8]) -> Prompt {
        let mut p = Prompt::default();
        hash_prompt(&[text], 256, 1, &mut p);
        p
    }

    fn pods() -> Vec<String> {
        (1..=4).map(|i| format!("10.0.0.{i}:8000")).collect()
    }

    #[test]
    fn a_copy_fed_the_events_sees_what_the_picker_sees() {
        let mut cfg = Config::default();
        cfg.prefix.as_mut().unwrap().block_bytes = 256;
        cfg.session = Some(crate::pick::SessionAffinity {
            headers: vec!["x-session-id".into()],
            idle_ns: 1_000_000_000_000,
        });
        let (mut a, mut b) = (Picker::new(cfg.clone(), &pods()), Picker::new(cfg, &pods()));
        let p = prompt(&[b'x'; 4096]);
        let req = Request {
            prompt: &p,
            session: Some(42),
            avoid: None,
        };
        let Choice::Pod(t) = a.pick(&req, 10) else {
            panic!("no pod")
        };
        let pod = t.pod();
        let ev = a.charged_event(&t, &p, Some(42), 10);
        let (backend, back) = decode(&encode(3, &ev)).unwrap();
        assert_eq!((backend, &back), (3, &ev));
        b.apply(&back);
        assert_eq!(b.load(pod), a.load(pod));
        assert_eq!(
            b.table(pod).unwrap().matched_prefix(&p.blocks),
            p.blocks.len()
        );
        assert_eq!(b.sessions.get(42, 11, 1_000_000), Some(pod as u16));
        // The copy decides the next request as the original would.
        let other = Request {
            session: None,
            ..req
        };
        let (Choice::Pod(t2), Choice::Pod(t2a)) = (b.pick(&other, 12), a.clone().pick(&other, 12))
        else {
            panic!("no pod")
        };
        assert_eq!(t2.pod(), t2a.pod());
        b.release(t2, Outcome::Aborted, 13);

        // Two failures released on `a` quarantine the pod on `b` too.
        let rel = Picker::released_event(&t, Outcome::Failed, 20);
        a.release(t, Outcome::Failed, 20);
        b.apply(&decode(&encode(3, &rel)).unwrap().1);
        assert_eq!(b.load(pod).unwrap().requests(b.epoch(21)), 0);
        let Choice::Pod(t3) = a.pick(&other, 30) else {
            panic!("no pod")
        };
        assert_eq!(t3.pod(), pod);
        let (c3, r3) = (
            a.charged_event(&t3, &p, None, 30),
            Picker::released_event(&t3, Outcome::Failed, 31),
        );
        a.release(t3, Outcome::Failed, 31);
        b.apply(&c3);
        b.apply(&r3);
        assert!(a.is_quarantined(pod, 32) && b.is_quarantined(pod, 32));
    }

    #[test]
    fn malformed_events_are_refused() {
        let ev = Event::Metrics {
            pod: 1,
            metrics: EngineMetrics {
                waiting: 2.0,
                running: 3.0,
                kv_usage: 0.5,
                computed_tokens: Some(1234.0),
                cache_tokens: Some(65536.0),
                at_ns: 9,
            },
        };
        let raw = encode(0, &ev);
        assert_eq!(decode(&raw), Some((0, ev)));
        assert_eq!(decode(&raw[..raw.len() - 1]), None);
        let mut long = raw.clone();
        long.push(0);
        assert_eq!(decode(&long), None);
        let mut nan = raw.clone();
        nan[8..16].copy_from_slice(&f64::NAN.to_bits().to_le_bytes());
        assert_eq!(decode(&nan), None);
        let mut unknown = raw;
        unknown[2] = VERSION + 1;
        assert_eq!(decode(&unknown), None);
        let unreported = Event::Metrics {
            pod: 1,
            metrics: EngineMetrics::default(),
        };
        assert_eq!(decode(&encode(0, &unreported)), Some((0, unreported)));
        let charged = encode(
            0,
            &Event::Charged {
                pod: 0,
                epoch: 0,
                work: 0,
                session: None,
                at_ns: 0,
                blocks: vec![1, 2],
            },
        );
        // A block count that does not match the bytes.
        let mut lie = charged.clone();
        lie[41] = 3;
        assert_eq!(decode(&lie), None);
        assert!(matches!(
            decode(&charged),
            Some((0, Event::Charged { session: None, .. }))
        ));
        let mut unknown_flag = charged.clone();
        unknown_flag[8] = 2;
        assert_eq!(decode(&unknown_flag), None);
        let done = Event::Released {
            pod: 2,
            epoch: 1,
            work: 5,
            prompt_bytes: 100,
            predicted: 1,
            outcome: Outcome::Done {
                prompt_tokens: Some(25),
                cached_tokens: None,
            },
            at_ns: 4,
        };
        assert_eq!(decode(&encode(1, &done)), Some((1, done)));
    }

    #[test]
    fn events_for_unknown_pods_are_ignored() {
        let mut p = Picker::new(Config::default(), &pods());
        p.apply(&Event::Charged {
            pod: 99,
            epoch: 0,
            work: 1,
            session: None,
            at_ns: 0,
            blocks: vec![],
        });
        p.apply(&Event::Released {
            pod: 99,
            epoch: 0,
            work: 1,
            prompt_bytes: 0,
            predicted: 0,
            outcome: Outcome::Failed,
            at_ns: 0,
        });
        assert!((0..4).all(|i| p.load(i).unwrap().requests(0) == 0));
    }
}
