//! The pick step's part of the plugin config (`crate::config::pick`), turned into the picker's
//! [`Config`].

use super::{Config, PrefixAffinity, SessionAffinity, MAX_PODS};
// The wire types, at the path the pick code names them by.
pub use crate::config::pick::*;

/// Most blocks remembered per pod (the seed's maximum).
const MAX_BLOCKS_PER_ENDPOINT: u64 = 262_144;

impl PickConfig {
    /// The picker's config for this backend. `seed` separates backends' block chains;
    /// `quarantine_ms` is `proxy.quarantineDuration`. Out-of-range sizes are clamped (the
    /// generator refuses them first).
    pub fn picker_config(&self, quarantine_ms: u64, seed: u64) -> Config {
        let d = PrefixAffinity::default();
        let base = Config::default();
        let bounds = self.bounds.clone().unwrap_or_default();
        Config {
            mode: self.mode,
            prefix: self.prefix_affinity.as_ref().map(|p| PrefixAffinity {
                block_bytes: p.block_bytes.map_or(d.block_bytes, |b| {
                    b.clamp(
                        super::blocks::MIN_BLOCK_BYTES as u64,
                        super::blocks::MAX_BLOCK_BYTES as u64,
                    ) as usize
                }),
                max_blocks_per_endpoint: p
                    .max_blocks_per_endpoint
                    .map_or(d.max_blocks_per_endpoint, |m| {
                        m.clamp(1, MAX_BLOCKS_PER_ENDPOINT) as usize
                    }),
            }),
            session: self.session_affinity.as_ref().map(|s| SessionAffinity {
                headers: s.headers.iter().map(|h| h.to_ascii_lowercase()).collect(),
                idle_ns: s
                    .idle_ms
                    .unwrap_or(DEFAULT_IDLE_MS)
                    .saturating_mul(1_000_000),
            }),
            quarantine_ns: quarantine_ms.saturating_mul(1_000_000),
            seed,
            known_balance_percent: bounds
                .known_balance_percent
                .unwrap_or(base.known_balance_percent),
            recent_half_life_ns: bounds
                .recent_half_life_ms
                .map_or(base.recent_half_life_ns, |ms| {
                    ms.max(1).saturating_mul(1_000_000)
                }),
            ..base
        }
    }

    /// Why the filter cannot use this config, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if self.endpoints.is_empty() {
            return Some("no endpoints to pick from".into());
        }
        if self.endpoints.len() > MAX_PODS {
            return Some(format!("more than {MAX_PODS} endpoints"));
        }
        self.endpoints
            .iter()
            .find(|e| e.parse::<std::net::SocketAddr>().is_err())
            .map(|e| format!("endpoint {e:?} is not an ip:port"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pick::Mode;

    #[test]
    fn defaults_and_clamps_map_onto_the_picker_config() {
        let w: PickConfig = serde_json::from_str(
            r#"{"endpoints":["10.0.0.1:8000"],"prefix_affinity":{"block_bytes":1},
                "session_affinity":{"headers":["X-Session-Id"]}}"#,
        )
        .unwrap();
        assert_eq!(w.mode, Mode::LoadAware);
        let c = w.picker_config(15_000, 7);
        let p = c.prefix.unwrap();
        assert_eq!(p.block_bytes, 256);
        assert_eq!(p.max_blocks_per_endpoint, 16_384);
        let s = c.session.unwrap();
        assert_eq!(s.headers, ["x-session-id"]);
        assert_eq!(s.idle_ns, DEFAULT_IDLE_MS * 1_000_000);
        assert_eq!(c.quarantine_ns, 15_000_000_000);
        assert_eq!(c.seed, 7);
        let d = Config::default();
        assert_eq!(c.known_balance_percent, d.known_balance_percent);
        assert_eq!(c.recent_half_life_ns, d.recent_half_life_ns);
        assert_eq!(w.problem(), None);
    }

    #[test]
    fn bounds_override_only_what_they_name() {
        let w: PickConfig = serde_json::from_str(
            r#"{"endpoints":["10.0.0.1:8000"],
                "bounds":{"known_balance_percent":0,"recent_half_life_ms":3600000}}"#,
        )
        .unwrap();
        let c = w.picker_config(15_000, 0);
        let d = Config::default();
        assert_eq!(c.known_balance_percent, 0);
        assert_eq!(c.recent_half_life_ns, 3_600_000_000_000);
        let half: PickConfig = serde_json::from_str(
            r#"{"endpoints":["10.0.0.1:8000"],"bounds":{"known_balance_percent":200}}"#,
        )
        .unwrap();
        let h = half.picker_config(0, 0);
        assert_eq!(h.known_balance_percent, 200);
        assert_eq!(h.recent_half_life_ns, d.recent_half_life_ns);
        let zero: PickConfig = serde_json::from_str(
            r#"{"endpoints":["10.0.0.1:8000"],"bounds":{"recent_half_life_ms":0}}"#,
        )
        .unwrap();
        assert_eq!(zero.picker_config(0, 0).recent_half_life_ns, 1_000_000);
        let typo = serde_json::from_str::<PickConfig>(
            r#"{"endpoints":["10.0.0.1:8000"],"bounds":{"known_percent":0}}"#,
        );
        assert!(typo.is_err(), "an unknown bound is refused, not ignored");
    }

    #[test]
    fn endpoints_must_be_socket_addresses() {
        let mut w: PickConfig = serde_json::from_str(r#"{"endpoints":[]}"#).unwrap();
        assert!(w.problem().is_some());
        w.endpoints = vec!["pod.svc:80".into()];
        assert!(w.problem().unwrap().contains("not an ip:port"));
    }
}
