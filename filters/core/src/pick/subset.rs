//! A pick bounded to a candidate subset: the proxy in front of an endpoint picker may name the
//! pods it allows for one request (the Inference Extension's
//! `x-gateway-destination-endpoint-subset`). The pick then weighs only those, with everything
//! else as usual (prefix, load, sessions, quarantine); none of them eligible is
//! `NoEligiblePod`, and a candidate outside the configured pods is never chosen, because a pick
//! is an index into the configured list.

use super::{Choice, Picker, Request};
use std::net::SocketAddr;

/// At most this many candidates are read from one list (a pod set is at most `MAX_PODS`).
const MAX_CANDIDATES: usize = 4 * super::MAX_PODS;

impl Picker {
    /// Which configured pods `list` (comma-separated `ip:port`) names. Addresses compare as
    /// socket addresses where both parse, so `[::1]:80` and `[0:0::1]:80` are one pod.
    pub fn subset_mask(&self, list: &str) -> Vec<bool> {
        let wanted: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .take(MAX_CANDIDATES)
            .collect();
        let parsed: Vec<Option<SocketAddr>> = wanted.iter().map(|w| w.parse().ok()).collect();
        self.pods
            .iter()
            .map(|p| {
                let addr = p.addr.parse::<SocketAddr>().ok();
                wanted.iter().zip(&parsed).any(|(w, a)| match (a, addr) {
                    (Some(a), Some(b)) => *a == b,
                    _ => *w == p.addr,
                })
            })
            .collect()
    }

    /// [`Picker::pick`] among the pods `allowed` marks (by index; missing entries are not
    /// allowed). An all-false mask is `NoEligiblePod`.
    pub fn pick_within(&mut self, req: &Request<'_>, allowed: &[bool], now: u64) -> Choice {
        if !allowed.iter().any(|&a| a) {
            return Choice::NoEligiblePod;
        }
        self.only = allowed.to_vec();
        let choice = self.pick(req, now);
        self.only.clear();
        choice
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;

    fn picker() -> Picker {
        let pods: Vec<String> = (1..=4).map(|i| format!("10.0.0.{i}:8000")).collect();
        Picker::new(Config::default(), &pods)
    }

    fn prompt() -> Prompt {
        let mut p = Prompt::default();
        hash_prompt(
            &[b"the same long system prompt".repeat(40).as_slice()],
            256,
            0,
            &mut p,
        );
        p
    }

    #[test]
    fn the_mask_names_configured_pods_only() {
        let p = picker();
        assert_eq!(
            p.subset_mask(" 10.0.0.2:8000,10.0.0.9:8000 , 169.254.169.254:80,10.0.0.4:8000"),
            vec![false, true, false, true]
        );
        assert_eq!(p.subset_mask(""), vec![false; 4]);
    }

    #[test]
    fn a_bounded_pick_stays_in_the_subset_and_the_next_pick_is_unbounded_again() {
        let mut p = picker();
        let pr = prompt();
        let req = Request {
            prompt: &pr,
            session: None,
            avoid: None,
        };
        // Least-loaded with every pod idle again after each release: the same pod each time,
        // unless the bound takes it away.
        let Choice::Pod(home) = p.pick(&req, 0) else {
            panic!("no pod")
        };
        let warm = home.pod();
        p.release(
            home,
            Outcome::Done {
                prompt_tokens: None,
                cached_tokens: None,
            },
            0,
        );
        let mut allowed = vec![true; 4];
        allowed[warm] = false;
        for _ in 0..8 {
            let Choice::Pod(t) = p.pick_within(&req, &allowed, 0) else {
                panic!("no pod in the subset")
            };
            assert!(allowed[t.pod()], "picked {} outside the subset", t.pod());
            p.release(
                t,
                Outcome::Done {
                    prompt_tokens: None,
                    cached_tokens: None,
                },
                0,
            );
        }
        let Choice::Pod(t) = p.pick(&req, 0) else {
            panic!("no pod")
        };
        assert_eq!(t.pod(), warm, "the bound ended with its pick");
        p.release(
            t,
            Outcome::Done {
                prompt_tokens: None,
                cached_tokens: None,
            },
            0,
        );
        assert_eq!(p.pick_within(&req, &[false; 4], 0), Choice::NoEligiblePod);
        assert_eq!(p.pick_within(&req, &[], 0), Choice::NoEligiblePod);
    }
}
