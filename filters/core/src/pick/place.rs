//! Where a request goes that no live session holds.
//!
//! A prompt some pod is known to hold goes to the pod holding the longest prefix of it among
//! the pods within the load bound (at most [`LOAD_SLACK_REQUESTS`] more requests in flight than
//! the least loaded, and not sent more than `known_balance_percent` of the mean recent prefill),
//! ties to the less loaded. A prompt no pod is known to hold goes to its home: the first pod by
//! rendezvous hashing on its first block among the pods within [`HOME_SLACK_REQUESTS`] of the
//! least loaded (consistent hashing with bounded loads).
//!
//! The home is what makes the placement hold up when the table is empty or wrong: a prefix the
//! table forgot, or that another gateway replica placed, still goes where its cache most likely
//! is, and every replica computes the same home without sharing anything. Where other gateways
//! send to the same pods (`Company::Others`, read from the engines' counters), a prompt this
//! gateway does not know is not thereby new to the pods: the other replicas placed it at the
//! same home, so it goes home within the known-prefix slack ([`LOAD_SLACK_REQUESTS`]) like a
//! prefix the pod is known to hold. The tight home slack would send it to the next pod as soon
//! as this gateway's own share of the home's load (its in-flight count, a fraction of the
//! pod's) ran one ahead, at a moment that differs per replica, copying the prefix once per
//! replica into caches that may hold only a few tenants.

use super::blocks::mix;
use super::{Company, Picker};

/// A pod holding some of the prompt stays a candidate while it has at most this many more
/// requests in flight than the least loaded pod: reusing a cached prefix saves a whole prefill,
/// far more than waiting behind a few requests. Past it the prefix is copied to the next pod,
/// which then holds it too.
pub const LOAD_SLACK_REQUESTS: u64 = 4;

/// A prompt no pod is known to hold goes to its home while the home has at most this many more
/// requests in flight than the least loaded pod: nothing known cached is traded for the wait,
/// so the bound is tight (a unique prompt then waits about as a least-loaded balancer's).
/// Among other gateways the home gets [`LOAD_SLACK_REQUESTS`] instead (see the module doc).
pub const HOME_SLACK_REQUESTS: u64 = 1;

impl Picker {
    /// Requests in flight on pod `i` that this gateway sent. The engines' own counts are not
    /// used: they are up to a scrape period old, and replicas that read them at different
    /// moments would bound the same pod differently and stop agreeing on homes.
    pub fn in_flight(&self, i: usize, now: u64) -> u64 {
        self.loads
            .get(i)
            .map_or(u64::MAX, |l| u64::from(l.requests(self.epoch(now))))
    }

    /// The pod for a request whose prefix each pod holds `matched` table blocks of, or `None`
    /// when no pod is eligible. `leaving`: a pod the request must not stay on; `home_key`: the
    /// hash ranking the pods for a prompt no pod holds (`None`: nothing to be consistent about,
    /// the least loaded).
    pub(crate) fn place(
        &self,
        matched: &[usize],
        leaving: Option<usize>,
        avoid: Option<usize>,
        home_key: Option<u64>,
        prompt_bytes: u64,
        now: u64,
    ) -> Option<usize> {
        let live: Vec<usize> = (0..self.pods.len())
            .filter(|&i| Some(i) != leaving && self.eligible(i, now, avoid))
            .collect();
        let flight: Vec<u64> = live.iter().map(|&i| self.in_flight(i, now)).collect();
        let least = flight.iter().copied().min()?;
        let Some(home_key) = home_key else {
            return live
                .iter()
                .zip(&flight)
                .min_by_key(|&(&i, &f)| (f, self.load_bytes(i, now), i))
                .map(|(&i, _)| i);
        };
        let rendezvous = |i: usize| mix(home_key ^ self.pods[i].id);
        let held = |i: usize| matched.get(i).copied().unwrap_or(0);
        let within = |slack: u64| {
            live.iter()
                .zip(&flight)
                .filter(move |&(_, &f)| f <= least.saturating_add(slack))
        };
        if live.iter().all(|&i| held(i) == 0) {
            let slack = match self.company(now) {
                Company::Others => LOAD_SLACK_REQUESTS,
                Company::Alone | Company::Unknown => HOME_SLACK_REQUESTS,
            };
            return within(slack)
                .max_by_key(|&(&i, _)| rendezvous(i))
                .map(|(&i, _)| i);
        }
        // A pod sent far more prefill than the others recently sheds known prefixes too, so
        // one hot tenant does not leave the other pods idle; if that leaves none, the load
        // bound alone.
        let over = self.over_balance(self.cfg.known_balance_percent, prompt_bytes, now, avoid);
        let best = |shed: bool| {
            within(LOAD_SLACK_REQUESTS)
                .filter(|&(&i, _)| !(shed && over.get(i) == Some(&true)))
                .max_by_key(|&(&i, &f)| (held(i), u64::MAX - f, rendezvous(i)))
                .map(|(&i, _)| i)
        };
        best(true).or_else(|| best(false))
    }
}
