//! Who gets a stream slot, and bytes of memory, and who loses them.
//!
//! A gateway opens an ext_proc stream when a request's headers arrive, and (in `BUFFERED`
//! mode) sends the body only once the client has uploaded all of it. A client that sends half a
//! body therefore holds a slot here for as long as it likes, and a thousand such clients would
//! hold all of them. So slots are split by what a stream is waiting for:
//!
//! - an *uploading* stream waits for more of its request (its body, trailers): at most
//!   `max_uploading` of them, the rest of the slots stay for streams whose request is complete
//!   (waiting on, or streaming, the upstream's answer);
//! - when the uploading share is full, a new stream takes the place of the uploading stream that
//!   has waited longest for its next message, if that wait is over [`EVICT_AFTER`]: a stalled
//!   upload loses its slot to a request that can make progress, so a slow-client attack degrades
//!   only its own requests. The evicted stream is answered 408.
//!
//! Memory is admitted the same way: the request bytes every stream holds (announced by
//! `content-length`, or received) are charged against one budget; a stream that would exceed it
//! is answered 503 at once, before its body is uploaded when the length is announced.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// An uploading stream that has waited this long for its next message may be evicted in favour
/// of a new stream; a younger one may not (a burst of legitimate uploads is refused, not
/// churned).
pub const EVICT_AFTER: Duration = Duration::from_secs(1);

/// A stream found no slot: every slot is taken, or every uploading one by streams too young to
/// evict (answered 503 with `Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSlot;

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Counters {
    pub refused_streams: AtomicU64,
    pub refused_memory: AtomicU64,
    pub evicted: AtomicU64,
    pub idle_timeouts: AtomicU64,
    pub request_timeouts: AtomicU64,
    pub too_many_headers: AtomicU64,
}

pub struct Admission {
    max_streams: usize,
    max_uploading: usize,
    memory_budget: usize,
    state: Mutex<State>,
    pub counters: Counters,
}

#[derive(Default)]
struct State {
    next_id: u64,
    streams: HashMap<u64, Entry>,
    uploading: usize,
    buffered: usize,
    /// The most charged at once since the allocator last returned memory to the system.
    peak_since_trim: usize,
}

/// Request bytes held at once that make returning freed memory to the system worth a call
/// (glibc keeps large freed buffers in its arenas otherwise: the resident size would stay at the
/// peak of the last burst of large bodies).
const TRIM_AFTER_PEAK: usize = 16 << 20;

struct Entry {
    uploading: bool,
    /// When the stream last received a message (or opened).
    last: Instant,
    charged: usize,
    evict: Arc<Notify>,
}

/// A stream's slot; released (with its memory) on drop.
pub struct Ticket {
    id: u64,
    admission: Arc<Admission>,
    evict: Arc<Notify>,
}

impl Admission {
    pub fn new(max_streams: usize, max_uploading: usize, memory_budget: usize) -> Arc<Admission> {
        Arc::new(Admission {
            max_streams,
            max_uploading: max_uploading.clamp(1, max_streams),
            memory_budget,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new (uploading) stream, evicting the longest-stalled upload when the
    /// uploading share is full.
    pub fn admit(self: &Arc<Self>) -> Result<Ticket, NoSlot> {
        self.admit_at(Instant::now())
    }

    fn admit_at(self: &Arc<Self>, now: Instant) -> Result<Ticket, NoSlot> {
        let mut s = self.lock();
        let full = s.streams.len() >= self.max_streams || s.uploading >= self.max_uploading;
        if full && !self.evict_stalled(&mut s, now) {
            self.counters
                .refused_streams
                .fetch_add(1, Ordering::Relaxed);
            return Err(NoSlot);
        }
        // Room in the uploading share can still leave every slot taken by served streams.
        if s.streams.len() >= self.max_streams {
            self.counters
                .refused_streams
                .fetch_add(1, Ordering::Relaxed);
            return Err(NoSlot);
        }
        let id = s.next_id;
        s.next_id += 1;
        let evict = Arc::new(Notify::new());
        s.streams.insert(
            id,
            Entry {
                uploading: true,
                last: now,
                charged: 0,
                evict: evict.clone(),
            },
        );
        s.uploading += 1;
        Ok(Ticket {
            id,
            admission: self.clone(),
            evict,
        })
    }

    /// Evicts the uploading stream that has waited longest, if it waited over [`EVICT_AFTER`].
    fn evict_stalled(&self, s: &mut State, now: Instant) -> bool {
        let oldest = s
            .streams
            .iter()
            .filter(|(_, e)| e.uploading)
            .min_by_key(|(_, e)| e.last)
            .map(|(id, e)| (*id, e.last));
        let Some((id, last)) = oldest else {
            return false;
        };
        if now.saturating_duration_since(last) < EVICT_AFTER {
            return false;
        }
        if let Some(e) = s.streams.remove(&id) {
            s.uploading -= 1;
            s.buffered = s.buffered.saturating_sub(e.charged);
            // Stored as a permit if its task is not waiting right now.
            e.evict.notify_one();
        }
        self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        true
    }

    pub fn in_flight(&self) -> usize {
        self.lock().streams.len()
    }

    pub fn uploading(&self) -> usize {
        self.lock().uploading
    }

    pub fn buffered_bytes(&self) -> usize {
        self.lock().buffered
    }

    /// Whether the buffers of a burst of large requests were freed since the last trim (the
    /// peak passed [`TRIM_AFTER_PEAK`] and what is held now is a quarter of it or less); resets
    /// the peak when it says so.
    pub fn trim_due(&self) -> bool {
        let mut s = self.lock();
        let due = s.peak_since_trim > TRIM_AFTER_PEAK && s.buffered <= s.peak_since_trim / 4;
        if due {
            s.peak_since_trim = s.buffered;
        }
        due
    }

    pub fn max_streams(&self) -> usize {
        self.max_streams
    }

    pub fn memory_budget(&self) -> usize {
        self.memory_budget
    }
}

impl Ticket {
    /// A message arrived: the stream made progress.
    pub fn progressed(&self) {
        if let Some(e) = self.admission.lock().streams.get_mut(&self.id) {
            e.last = Instant::now();
        }
    }

    /// The request is complete (decided or answered): the stream leaves the uploading share.
    pub fn request_complete(&self) {
        let mut s = self.admission.lock();
        let mut left = false;
        if let Some(e) = s.streams.get_mut(&self.id) {
            left = std::mem::replace(&mut e.uploading, false);
        }
        if left {
            s.uploading -= 1;
        }
    }

    /// Charges the stream up to `bytes` of request data in total; `false` (and nothing charged)
    /// when that does not fit the budget.
    pub fn charge_up_to(&self, bytes: usize) -> bool {
        let budget = self.admission.memory_budget;
        let mut s = self.admission.lock();
        let State {
            streams, buffered, ..
        } = &mut *s;
        let Some(e) = streams.get_mut(&self.id) else {
            return true;
        };
        let more = bytes.saturating_sub(e.charged);
        if more == 0 {
            return true;
        }
        if buffered.saturating_add(more) > budget {
            self.admission
                .counters
                .refused_memory
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        *buffered += more;
        e.charged += more;
        s.peak_since_trim = s.peak_since_trim.max(s.buffered);
        true
    }

    /// Resolves when another stream took this one's slot.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.admission.lock();
        if let Some(e) = s.streams.remove(&self.id) {
            if e.uploading {
                s.uploading -= 1;
            }
            s.buffered = s.buffered.saturating_sub(e.charged);
        }
    }
}

/// Returns the allocator's free memory to the system (glibc keeps freed buffers in its arenas).
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The memory budget when the config names none: half the container's memory limit (the rest
/// is the module instances, the gRPC buffers a body passes through and the runtime), or 512 MiB
/// when there is no limit.
pub fn default_memory_budget() -> usize {
    cgroup_memory_limit().map_or(DEFAULT_BUDGET_WITHOUT_LIMIT, |l| l / 2)
}

const DEFAULT_BUDGET_WITHOUT_LIMIT: usize = 512 << 20;

/// The memory limit of this process's cgroup (v2 `memory.max`, or v1's), if one is set.
pub fn cgroup_memory_limit() -> Option<usize> {
    for path in [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ] {
        if let Ok(text) = std::fs::read_to_string(path) {
            return parse_limit(&text);
        }
    }
    None
}

/// `max` or an absurdly large v1 value (no limit set) is `None`.
fn parse_limit(text: &str) -> Option<usize> {
    let n: u64 = text.trim().parse().ok()?;
    (n < 1 << 60).then(|| usize::try_from(n).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_uploading_share_evicts_the_longest_stalled_upload_only() {
        let a = Admission::new(4, 2, 1 << 20);
        let t0 = Instant::now();
        let first = a.admit_at(t0).unwrap();
        let second = a.admit_at(t0 + Duration::from_millis(300)).unwrap();
        // Both uploads are younger than EVICT_AFTER: the next one is refused, nobody evicted.
        assert_eq!(
            a.admit_at(t0 + Duration::from_millis(900)).err(),
            Some(NoSlot)
        );
        // Later, the oldest stalled upload gives its slot up.
        let third = a.admit_at(t0 + Duration::from_millis(1200)).unwrap();
        assert_eq!((a.in_flight(), a.uploading()), (2, 2));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(1), first.evicted())
                .await
                .expect("the oldest upload is told");
        });
        drop(first);
        assert_eq!(
            a.in_flight(),
            2,
            "dropping an evicted ticket frees nothing twice"
        );
        // A complete request leaves the uploading share: room for another upload.
        second.request_complete();
        let fourth = a.admit_at(t0 + Duration::from_millis(1300)).unwrap();
        assert_eq!((a.in_flight(), a.uploading()), (3, 2));
        drop((second, third, fourth));
        assert_eq!((a.in_flight(), a.uploading()), (0, 0));
        assert_eq!(a.counters.evicted.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn served_streams_keep_their_slots_and_all_slots_bound_the_total() {
        let a = Admission::new(2, 1, 1 << 20);
        let t0 = Instant::now();
        let x = a.admit_at(t0).unwrap();
        x.request_complete();
        let y = a.admit_at(t0).unwrap();
        y.request_complete();
        // No uploading stream to evict, every slot serving: refused.
        assert_eq!(a.admit_at(t0 + Duration::from_secs(5)).err(), Some(NoSlot));
        drop(x);
        assert!(a.admit_at(t0 + Duration::from_secs(5)).is_ok());
    }

    #[test]
    fn memory_is_charged_up_to_the_budget_and_returned_on_drop() {
        let a = Admission::new(8, 8, 1000);
        let x = a.admit().unwrap();
        let y = a.admit().unwrap();
        assert!(x.charge_up_to(600));
        assert!(x.charge_up_to(500), "already charged");
        assert!(!y.charge_up_to(401));
        assert!(y.charge_up_to(400));
        assert_eq!(a.buffered_bytes(), 1000);
        drop(x);
        assert_eq!(a.buffered_bytes(), 400);
        assert_eq!(a.counters.refused_memory.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_trim_is_due_once_a_large_peak_has_been_freed() {
        let a = Admission::new(8, 8, 1 << 30);
        let x = a.admit().unwrap();
        assert!(x.charge_up_to(32 << 20));
        assert!(!a.trim_due(), "still held");
        drop(x);
        assert!(a.trim_due());
        assert!(!a.trim_due(), "once per peak");
    }

    #[test]
    fn cgroup_limits_parse_max_as_none() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("1073741824\n"), Some(1 << 30));
    }
}
