//! Shadow copies the filter sends itself (`config::shadow`): where a shadow rule's copies go and
//! what each carries. On the Envoy targets the route mirrors them instead; either way a copy
//! follows the request's attempt order, so a request kept off the cloud (sensitive data,
//! `failClosed`) has an order, hence mirrors, without cloud backends.
//!
//! A copy is best effort: sent beside the request, never waited for, its answer discarded,
//! at most `max_in_flight` per target in flight across the gateway's workers ([`InFlight`]);
//! more are dropped and counted.

use crate::config::shadow::{ShadowConfig, ShadowTarget};
use crate::config::{Strategy, Tier};
use crate::headers::{is_token, SHADOW_HEADER};
use crate::rewrite::replace_with_string;
use crate::router::{Decision, Router};
use crate::scan::Span;

/// The backends a request's order mirrors to: every backend after the first of a shadow
/// rule's order, none for the other strategies.
pub fn mirrors(strategy: Strategy, order: &[usize]) -> &[usize] {
    match (strategy, order) {
        (Strategy::Shadow, [_, rest @ ..]) => rest,
        _ => &[],
    }
}

/// Whether a copy may go to a backend of `tier`: only to a local one. That holds for every
/// request, so a sensitive one never has a copy anywhere but a local backend, whatever its
/// order holds.
pub fn may_copy(tier: Tier) -> bool {
    tier == Tier::Local
}

/// The plugin config's shadow section, checked against the router's backends.
#[derive(Debug, Clone)]
pub struct Shadow {
    targets: Vec<ShadowTarget>,
    /// Per backend, its target's index.
    by_backend: Vec<Option<usize>>,
    max_in_flight: u32,
}

impl Shadow {
    /// `None` when the config has no shadow section; errors name the target that is wrong.
    pub fn new(router: &Router) -> Result<Option<Shadow>, String> {
        let Some(cfg) = &router.config.shadow else {
            return Ok(None);
        };
        Shadow::compile(cfg, router).map(Some)
    }

    fn compile(cfg: &ShadowConfig, router: &Router) -> Result<Shadow, String> {
        if cfg.max_in_flight == 0 {
            return Err("shadow.max_in_flight: must be at least 1".into());
        }
        let mut by_backend = vec![None; router.backends_len()];
        for (i, t) in cfg.targets.iter().enumerate() {
            let at = format!("shadow.targets[{i}]");
            let b = router
                .backend_index(&t.backend)
                .ok_or_else(|| format!("{at}: unknown backend {:?}", t.backend))?;
            if !may_copy(router.backend(b).tier) {
                return Err(format!(
                    "{at}: backend {:?} is not local; shadow copies go to local backends only",
                    t.backend
                ));
            }
            if by_backend[b].replace(i).is_some() {
                return Err(format!("{at}: backend {:?} listed twice", t.backend));
            }
            if t.cluster.is_empty() || t.authority.is_empty() {
                return Err(format!("{at}: cluster and authority must be set"));
            }
            let bad = |s: &str| s.bytes().any(|c| c <= b' ' || c == 0x7f);
            if bad(&t.authority) || t.path_prefix.as_deref().is_some_and(bad) {
                return Err(format!(
                    "{at}: authority and path_prefix take no spaces or control characters"
                ));
            }
            if t.path_prefix
                .as_deref()
                .is_some_and(|p| !p.starts_with('/'))
            {
                return Err(format!("{at}: path_prefix must start with /"));
            }
            if t.timeout_ms == 0 {
                return Err(format!("{at}: timeout_ms must be at least 1"));
            }
        }
        Ok(Shadow {
            targets: cfg.targets.clone(),
            by_backend,
            max_in_flight: cfg.max_in_flight,
        })
    }

    pub fn targets(&self) -> &[ShadowTarget] {
        &self.targets
    }

    /// Where a decided request's copies go: `(backend, target)` for each mirror of its order
    /// that has a target and may take a copy.
    pub fn copies(&self, router: &Router, decision: &Decision) -> Vec<(usize, usize)> {
        let strategy = decision
            .rule
            .map_or(Strategy::PrimaryFallback, |r| router.rule(r).strategy);
        mirrors(strategy, &decision.order)
            .iter()
            .filter(|&&b| may_copy(router.backend(b).tier))
            .filter_map(|&b| Some((b, self.by_backend.get(b).copied().flatten()?)))
            .collect()
    }

    pub fn max_in_flight(&self) -> u32 {
        self.max_in_flight
    }
}

/// The copies in flight to one target, kept in the gateway's shared data so that every worker
/// (every module instance of `llmkube-ext-proc`) counts against one bound, as Envoy's shadow
/// cluster does: each copy as its deadline (`now` + its timeout, nanoseconds). A copy stops
/// counting when it is answered, or at its deadline, by which the host has failed it: a worker
/// that went away (replaced after a trap) never holds a slot for longer than that.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlight(Vec<u64>);

impl InFlight {
    /// The shared value; one that does not parse counts as none in flight.
    pub fn decode(bytes: &[u8]) -> InFlight {
        if !bytes.len().is_multiple_of(8) {
            return InFlight::default();
        }
        InFlight(
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        )
    }

    pub fn encode(&self) -> Vec<u8> {
        self.0.iter().flat_map(|d| d.to_le_bytes()).collect()
    }

    /// Copies in flight at `now`.
    pub fn count(&self, now: u64) -> usize {
        self.0.iter().filter(|&&d| d > now).count()
    }

    /// Takes a slot until `deadline` unless `max` copies are in flight at `now` (then the copy
    /// is dropped); forgets the copies past their deadline either way.
    pub fn take(&mut self, now: u64, deadline: u64, max: u32) -> bool {
        self.0.retain(|&d| d > now);
        if self.0.len() >= max as usize {
            return false;
        }
        self.0.push(deadline);
        true
    }

    /// The copy that took the slot until `deadline` is done (answered, failed or not sent).
    pub fn release(&mut self, deadline: u64) {
        if let Some(i) = self.0.iter().position(|&d| d == deadline) {
            self.0.swap_remove(i);
        }
    }
}

/// What the client's request carried that a copy needs.
#[derive(Debug, Clone, Copy)]
pub struct Original<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub content_type: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub body: &'a [u8],
    /// Where the body's `model` is, for the served-model rewrite.
    pub model_span: Option<Span>,
}

/// One copy, ready for the callout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRequest {
    pub cluster: String,
    /// In order: `:method`, `:path`, `:authority`, then the copy's headers.
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// The copy of `original` for `target` (to `backend`): the same method, path (under the
/// target's prefix) and body, the body's `model` as the backend serves it (what the
/// gateway's own attempt to it would carry), the content type and request id, and the shadow
/// mark. No other client header: a copy carries no credential or routing header of the
/// client's.
pub fn copy_for(
    router: &Router,
    backend: usize,
    target: &ShadowTarget,
    original: &Original<'_>,
) -> CopyRequest {
    let path = match (&target.path_prefix, original.path.strip_prefix("/v1")) {
        (Some(prefix), Some(rest)) if rest.is_empty() || rest.starts_with(['/', '?']) => {
            format!("{prefix}{rest}")
        }
        _ => original.path.to_string(),
    };
    let served = router.backend(backend).served_model.as_deref();
    let body = match (served, original.model_span) {
        (Some(m), Some(span)) if span.1 <= original.body.len() && span.0 < span.1 => {
            replace_with_string(original.body, span, m)
        }
        _ => original.body.to_vec(),
    };
    let mut headers = vec![
        (":method", original.method.to_string()),
        (":path", path),
        (":authority", target.authority.clone()),
    ];
    let value_ok = |v: &&str| !v.bytes().any(|c| c == b'\r' || c == b'\n' || c == 0);
    if let Some(ct) = original.content_type.filter(value_ok) {
        headers.push(("content-type", ct.to_string()));
    }
    if let Some(id) = original.request_id.filter(value_ok) {
        headers.push(("x-request-id", id.to_string()));
    }
    headers.push((SHADOW_HEADER, "true".to_string()));
    debug_assert!(headers.iter().skip(3).all(|(n, _)| is_token(n)));
    CopyRequest {
        cluster: target.cluster.clone(),
        headers,
        body,
        timeout_ms: target.timeout_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn router(shadow: serde_json::Value) -> Result<Router, String> {
        Router::from_json(
            json!({
                "router": "llm/r",
                "backends": [
                    {"name": "a"},
                    {"name": "b", "served_model": "Qwen/Qwen3-8B"},
                    {"name": "cloud", "tier": "cloud", "external_model": "gpt-4o"}
                ],
                "rules": [
                    {"name": "pii", "data_classification": ["pii"], "strategy": "shadow",
                     "backends": ["a", "b", "cloud"]},
                    {"name": "mirror", "models": ["*"], "strategy": "shadow",
                     "backends": ["a", "cloud", "b"]},
                    {"name": "plain", "models": ["p"], "backends": ["a", "b"]}
                ],
                "shadow": shadow
            })
            .to_string()
            .as_bytes(),
        )
    }

    fn target(backend: &str) -> serde_json::Value {
        json!({"backend": backend, "cluster": format!("shadow-{backend}"),
               "authority": format!("{backend}:8000"), "timeout_ms": 1000})
    }

    fn shadow(targets: Vec<serde_json::Value>) -> (Router, Shadow) {
        let r = router(json!({"max_in_flight": 4, "targets": targets})).unwrap();
        let s = Shadow::new(&r).unwrap().unwrap();
        (r, s)
    }

    #[test]
    fn mirrors_are_a_shadow_orders_tail() {
        assert_eq!(mirrors(Strategy::Shadow, &[2, 0, 1]), &[0, 1]);
        assert!(mirrors(Strategy::Shadow, &[2]).is_empty());
        assert!(mirrors(Strategy::Weighted, &[2, 0, 1]).is_empty());
        assert!(mirrors(Strategy::PrimaryFallback, &[2, 0, 1]).is_empty());
    }

    #[test]
    fn copies_go_to_local_mirrors_with_a_target_only() {
        let (r, s) = shadow(vec![target("b")]);
        let d = |rule, order: Vec<usize>, sensitive| Decision {
            rule: Some(rule),
            order,
            sensitive,
        };
        assert_eq!(s.copies(&r, &d(1, vec![0, 2, 1], false)), vec![(1, 0)]);
        // Even an order that held a cloud backend for a sensitive request gets no copy there.
        assert_eq!(s.copies(&r, &d(0, vec![0, 1, 2], true)), vec![(1, 0)]);
        assert!(s.copies(&r, &d(0, vec![0, 2], true)).is_empty());
        // Not a shadow rule, or no target for the mirror: nothing.
        assert!(s.copies(&r, &d(2, vec![0, 1], false)).is_empty());
        assert!(s.copies(&r, &d(1, vec![1, 0], false)).is_empty());
    }

    #[test]
    fn a_target_must_be_a_known_local_backend_listed_once() {
        for (targets, why) in [
            (vec![target("nope")], "unknown backend"),
            (vec![target("cloud")], "not local"),
            (vec![target("b"), target("b")], "listed twice"),
        ] {
            let e = router(json!({"max_in_flight": 4, "targets": targets})).unwrap();
            let err = Shadow::new(&e).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let mut t = target("b");
        t["authority"] = json!("b:80\r\nx: y");
        let r = router(json!({"max_in_flight": 4, "targets": [t]})).unwrap();
        assert!(Shadow::new(&r).is_err());
        let r = router(json!({"max_in_flight": 0, "targets": []})).unwrap();
        assert!(Shadow::new(&r).is_err());
        assert!(Shadow::new(&router(json!(null)).unwrap())
            .unwrap()
            .is_none());
    }

    #[test]
    fn copies_in_flight_are_bounded_and_expire_at_their_deadline() {
        let mut f = InFlight::default();
        assert!((0..4).all(|i| f.take(0, 100 + i, 4)));
        assert!(!f.take(50, 200, 4), "four in flight");
        f.release(101);
        assert_eq!(f.count(50), 3);
        assert!(f.take(50, 200, 4));
        // Past their deadlines the three left count no more (their worker may be gone).
        assert_eq!(f.count(150), 1);
        assert!(f.take(150, 300, 4));
        assert_eq!(InFlight::decode(&f.encode()), f);
        f.release(999);
        assert_eq!(f.count(150), 2);
        assert_eq!(InFlight::decode(b"odd"), InFlight::default());
    }

    #[test]
    fn a_copy_carries_the_body_as_the_backend_serves_it_and_the_mark() {
        let (r, s) = shadow(vec![target("a"), target("b")]);
        let body = br#"{"model":"m","messages":[]}"#;
        let original = Original {
            method: "POST",
            path: "/v1/chat/completions",
            content_type: Some("application/json"),
            request_id: Some("id-1"),
            body,
            model_span: Some((9, 12)),
        };
        let c = copy_for(&r, 1, &s.targets()[1], &original);
        assert_eq!(c.cluster, "shadow-b");
        assert_eq!(
            c.headers,
            vec![
                (":method", "POST".to_string()),
                (":path", "/v1/chat/completions".to_string()),
                (":authority", "b:8000".to_string()),
                ("content-type", "application/json".to_string()),
                ("x-request-id", "id-1".to_string()),
                (SHADOW_HEADER, "true".to_string()),
            ]
        );
        assert_eq!(c.body, br#"{"model":"Qwen/Qwen3-8B","messages":[]}"#);
        // No served model: the body as sent.
        assert_eq!(copy_for(&r, 0, &s.targets()[0], &original).body, body);
        let mut t = s.targets()[0].clone();
        t.path_prefix = Some("/engine/v1".into());
        let c = copy_for(&r, 0, &t, &original);
        assert_eq!(c.headers[1].1, "/engine/v1/chat/completions");
    }
}
