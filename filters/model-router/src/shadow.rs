//! Shadow copies the filter sends itself (`router_core::shadow`), where the gateway's own
//! mirrors cannot carry the body: after the decision, one copy per mirror of the request's
//! order, fire and forget.
//!
//! The request's context only prepares a copy and takes its slot (in shared data: one bound
//! across the gateway's workers, `router_core::shadow::InFlight`); the root context sends it, on
//! the wake-up the request rings (`filter_edge::wake`). A callout belongs to the context that
//! made it, and the host drops a request context's callouts when its stream ends: made by the
//! root, a copy is still sent, and its answer still frees its slot, when the client's exchange
//! finished first.

use crate::metrics::counter;
use filter_edge::shared_table::HostStore;
use filter_edge::wake::Wake;
use filter_edge::{self as edge, HttpCall, Level};
use router_core::audit::AuditRecord;
use router_core::router::{Decision, Router};
use router_core::shadow::{copy_for, CopyRequest, InFlight, Original, Shadow as Plan};
use router_core::shared_data::{compare_and_swap, Swap};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Duration;

/// A copy ready to go: its backend, its target, the request.
pub(crate) struct Prepared {
    backend: usize,
    target: usize,
    copy: CopyRequest,
}

/// `llmkube.shadow.backend.<b>.{sent,dropped,failed}` of one target.
struct Stats {
    sent: Option<u32>,
    dropped: Option<u32>,
    failed: Option<u32>,
}

/// A copy's hold on its target's slot: the target and the slot's deadline.
#[derive(Debug, Clone, Copy)]
struct Slot {
    target: usize,
    deadline: u64,
}

pub(crate) struct Shadow {
    plan: Plan,
    /// Per target, the shared-data key of its copies in flight (`InFlight`).
    keys: Vec<String>,
    /// Copies whose slot is taken, waiting for the root.
    queued: RefCell<VecDeque<(Slot, CopyRequest)>>,
    /// Callouts in flight: token and slot.
    sent: RefCell<Vec<(u32, Slot)>>,
    /// The root's wake-up; `None` when the host would not register it (copies then fail).
    wake: Option<Wake>,
    stats: Vec<Stats>,
}

fn bump(id: Option<u32>) {
    if let Some(id) = id {
        edge::increment_metric(id, 1);
    }
}

impl Shadow {
    /// `None` without a shadow section; `nonce` makes this worker's queue name its own.
    pub fn configure(router: &Router, nonce: u64) -> Result<Option<Shadow>, String> {
        let Some(plan) = Plan::new(router)? else {
            return Ok(None);
        };
        let name = format!("llmkube-shadow/{}/{nonce:016x}", router.config.router);
        let wake = match Wake::register(&name) {
            Ok(w) => Some(w),
            Err(e) => {
                edge::log(
                    Level::Error,
                    &format!("model-router: shadow: no wake-up queue, copies will fail: {e}"),
                );
                None
            }
        };
        let stats = plan
            .targets()
            .iter()
            .map(|t| {
                let stat =
                    |what: &str| counter(&format!("llmkube.shadow.backend.{}.{what}", t.backend));
                Stats {
                    sent: stat("sent"),
                    dropped: stat("dropped"),
                    failed: stat("failed"),
                }
            })
            .collect();
        let prefix = router_core::shared_codec::key("shadow", &router.config.router);
        let keys = plan
            .targets()
            .iter()
            .map(|t| format!("{prefix}/{}", t.backend))
            .collect();
        Ok(Some(Shadow {
            keys,
            plan,
            queued: RefCell::new(VecDeque::new()),
            sent: RefCell::new(Vec::new()),
            wake,
            stats,
        }))
    }

    /// Whether a decided request has copies to send (then its body is needed).
    pub fn wants(&self, router: &Router, decision: &Decision) -> bool {
        !self.plan.copies(router, decision).is_empty()
    }

    /// The request's copies, built from the client's request before any edit of its body.
    pub fn prepare(
        &self,
        router: &Router,
        decision: &Decision,
        original: &Original<'_>,
    ) -> Vec<Prepared> {
        self.plan
            .copies(router, decision)
            .into_iter()
            .filter_map(|(backend, target)| {
                let t = self.plan.targets().get(target)?;
                Some(Prepared {
                    backend,
                    target,
                    copy: copy_for(router, backend, t, original),
                })
            })
            .collect()
    }

    /// The request goes upstream: each copy takes its target's slot, or is dropped when the
    /// target has its most in flight; the root is woken to send them. Both are audited.
    pub fn send(&self, router: &Router, prepared: Vec<Prepared>, audit: &mut AuditRecord) {
        if prepared.is_empty() {
            return;
        }
        let now = edge::now_nanos();
        for p in prepared {
            let name = router.backend(p.backend).name.clone();
            let deadline = now.saturating_add(p.copy.timeout_ms.saturating_mul(1_000_000));
            let slot = Slot {
                target: p.target,
                deadline,
            };
            if self.take(slot, now) {
                self.queued.borrow_mut().push_back((slot, p.copy));
                audit.shadow_sent.push(name);
            } else {
                bump(self.stats.get(p.target).and_then(|s| s.dropped));
                audit.shadow_dropped.push(name);
            }
        }
        let rung = match &self.wake {
            Some(w) => w.ring().map_err(|e| e.to_string()),
            None => Err("no wake-up queue".to_string()),
        };
        if let Err(e) = rung {
            edge::log(
                Level::Warn,
                &format!("model-router: shadow: waking the root: {e}"),
            );
            // Not sent: free the slots now rather than leave them taken.
            let waiting: Vec<(Slot, CopyRequest)> = self.queued.borrow_mut().drain(..).collect();
            for (slot, _) in waiting {
                self.failed(slot);
            }
        }
    }

    /// Updates a target's copies in flight in shared data (a compare-and-swap, retried when
    /// another worker wrote first); `f` says whether to write. `false` when the update could
    /// not be made or `f` declined.
    fn update(&self, target: usize, f: impl Fn(&mut InFlight) -> bool) -> bool {
        let Some(key) = self.keys.get(target) else {
            return false;
        };
        let written = compare_and_swap(&HostStore, key, None, |raw| {
            let mut flights = raw.map(|v| InFlight::decode(&v)).unwrap_or_default();
            Ok::<_, ()>(if f(&mut flights) {
                Swap::Write(flights.encode(), true)
            } else {
                Swap::Keep(false)
            })
        });
        match written {
            Ok(w) => w,
            Err(e) => {
                edge::log(Level::Warn, &format!("model-router: shadow: {key}: {e:?}"));
                false
            }
        }
    }

    /// Takes a slot for a copy; `false`: the target has its most in flight (or shared data
    /// could not be updated), the copy is dropped.
    fn take(&self, slot: Slot, now: u64) -> bool {
        let max = self.plan.max_in_flight();
        self.update(slot.target, |f| f.take(now, slot.deadline, max))
    }

    /// The copy is done: its slot is free (else it frees itself at its deadline).
    fn release(&self, slot: Slot) {
        self.update(slot.target, |f| {
            f.release(slot.deadline);
            true
        });
    }

    fn failed(&self, slot: Slot) {
        self.release(slot);
        bump(self.stats.get(slot.target).and_then(|s| s.failed));
    }

    /// The root's `on_queue_ready`: sends every waiting copy. `false` when `queue` is not ours.
    pub fn on_ring(&self, queue: u32) -> bool {
        let Some(wake) = self.wake.as_ref().filter(|w| w.id() == queue) else {
            return false;
        };
        wake.drain();
        loop {
            let Some((slot, copy)) = self.queued.borrow_mut().pop_front() else {
                break;
            };
            match dispatch(&copy) {
                Ok(token) => {
                    self.sent.borrow_mut().push((token, slot));
                    bump(self.stats.get(slot.target).and_then(|s| s.sent));
                }
                Err(e) => {
                    edge::log(
                        Level::Warn,
                        &format!("model-router: shadow: copy to {}: {e}", copy.cluster),
                    );
                    self.failed(slot);
                }
            }
        }
        true
    }

    /// The root's `on_http_call_response`: a copy's answer (discarded) frees its slot; no
    /// answer, or a 5xx, counts as failed. `false` when `token` is not a copy.
    pub fn answered(&self, token: u32, num_headers: usize) -> bool {
        let slot = {
            let mut sent = self.sent.borrow_mut();
            let Some(i) = sent.iter().position(|(t, _)| *t == token) else {
                return false;
            };
            sent.swap_remove(i).1
        };
        let status = (num_headers > 0)
            .then(edge::call_response_headers)
            .and_then(Result::ok)
            .and_then(|h| {
                h.iter()
                    .find(|(n, _)| n.as_slice() == b":status")
                    .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u32>().ok())
            });
        if status.is_some_and(|s| s < 500) {
            self.release(slot);
        } else {
            self.failed(slot);
        }
        true
    }
}

fn dispatch(copy: &CopyRequest) -> Result<u32, String> {
    let headers: Vec<(&str, &str)> = copy.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let timeout = Duration::from_millis(copy.timeout_ms);
    let call = HttpCall {
        upstream: &copy.cluster,
        headers: &headers,
        body: &copy.body,
        trailers: &[],
        timeout,
    };
    edge::check_http_call(&call).map_err(|e| e.to_string())?;
    // The SDK's dispatch (as `budget_remote` explains): only calls registered with its
    // dispatcher get their answer delivered (here, to the root that is running now).
    proxy_wasm::hostcalls::dispatch_http_call(
        &copy.cluster,
        headers,
        Some(&copy.body),
        Vec::new(),
        Duration::from_millis(u64::from(edge::timeout_ms(timeout))),
    )
    .map_err(|s| format!("calling cluster {}: {s:?}", copy.cluster))
}
