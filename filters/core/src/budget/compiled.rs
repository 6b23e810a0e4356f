//! The compilation of the budgets part of the plugin configuration (`crate::config::budgets`)
//! into [`Budget`]s and prices.

use super::admit::{Budget, Scope};
use super::ledger::Caps;
use super::money::{parse_usd, Price};
// The wire types, at the path the budget code names them by.
pub use crate::config::budgets::*;

/// A configuration problem: where (`budgets[1].max_usd`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub why: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.why)
    }
}

/// What the filter decides with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledBudgets {
    pub budgets: Vec<Budget>,
    /// By backend name.
    pub prices: Vec<(String, Price)>,
    pub hold_ttl_s: u64,
    pub default_max_tokens: u64,
    pub max_teams: usize,
    /// Where the ledgers live and how requests are admitted on them.
    pub mode: Mode,
}

/// Where a router's ledgers live and how its requests are admitted on them: one mode per
/// router, decided at configuration (docs/budgets.md "Modes").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// This gateway's shared data; each worker admits on its own leases of the ledgers (the
    /// default for embedded ledgers).
    WorkerLeases,
    /// This gateway's shared data; one reserve and one settle in the ledger per request
    /// (`per_request`).
    PerRequest,
    /// `llmkube-budgets` (`service`): one reservation call per request, or with `lease` first
    /// against this gateway's leases held in Redis.
    Shared {
        service: ServiceConfig,
        lease: Option<super::lease_config::Lease>,
    },
    /// Test-only controls that break the guarantee on purpose, so end-to-end tests can show
    /// what reservation prevents. Never written by the generator outside its test options.
    Unsafe(UnsafeMode),
}

/// The overshooting counterexamples ([`Mode::Unsafe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsafeMode {
    /// Admit by checking the embedded ledgers without holding anything; charge after the
    /// response (`unsafe_charge_after`).
    ChargeAfter,
    /// Worker leases whose room is granted but not held in the ledger
    /// (`unsafe_worker_leases_unheld`).
    WorkerLeasesUnheld,
}

impl Mode {
    /// The ledgers live in this gateway's shared data.
    pub fn embedded(&self) -> bool {
        !matches!(self, Mode::Shared { .. })
    }
}

impl CompiledBudgets {
    pub fn price(&self, backend: &str) -> Price {
        self.prices
            .iter()
            .find(|(b, _)| b == backend)
            .map_or(Price::default(), |(_, p)| *p)
    }
}

fn err(path: String, why: impl Into<String>) -> ConfigError {
    ConfigError {
        path,
        why: why.into(),
    }
}

impl BudgetsConfig {
    pub fn compile(&self) -> Result<CompiledBudgets, ConfigError> {
        let mut budgets = Vec::with_capacity(self.budgets.len());
        for (i, b) in self.budgets.iter().enumerate() {
            let at = |f: &str| format!("budgets[{i}].{f}");
            // The generator checks the seed's name pattern; here only what keys need.
            if b.name.is_empty() || b.name.len() > 63 {
                return Err(err(at("name"), "must be 1 to 63 bytes"));
            }
            if self.budgets[..i].iter().any(|o| o.name == b.name) {
                return Err(err(
                    at("name"),
                    format!("{:?} is used by an earlier budget", b.name),
                ));
            }
            if b.window_s == 0 {
                return Err(err(at("window_s"), "must be at least 1"));
            }
            let pico = match &b.max_usd {
                Some(s) => Some(parse_usd(s).map_err(|why| err(at("max_usd"), why))?),
                None => None,
            };
            if b.max_tokens == Some(0) {
                return Err(err(at("max_tokens"), "must be at least 1"));
            }
            if b.max_tokens.is_none() && pico.is_none() {
                return Err(err(
                    at("max_tokens"),
                    "either max_tokens or max_usd (or both) must be set",
                ));
            }
            if b.rule.is_some() && b.scope != ScopeName::Rule {
                return Err(err(at("rule"), "only for scope rule"));
            }
            if b.header.is_some() && b.scope != ScopeName::Team {
                return Err(err(at("header"), "only for scope team"));
            }
            let scope = match b.scope {
                ScopeName::Router => Scope::Router,
                ScopeName::Rule => match &b.rule {
                    Some(r) if !r.is_empty() => Scope::Rule(r.clone()),
                    _ => return Err(err(at("rule"), "scope rule needs the rule's name")),
                },
                ScopeName::Team => Scope::Team {
                    header: b
                        .header
                        .as_deref()
                        .unwrap_or(DEFAULT_TEAM_HEADER)
                        .to_ascii_lowercase(),
                },
            };
            budgets.push(Budget {
                name: b.name.clone(),
                scope,
                caps: Caps {
                    tokens: b.max_tokens,
                    pico,
                },
                window_s: b.window_s,
            });
        }
        let mut prices = Vec::with_capacity(self.prices.len());
        for (i, p) in self.prices.iter().enumerate() {
            let price =
                Price::from_per_million(p.prompt_usd.as_deref(), p.completion_usd.as_deref())
                    .map_err(|why| err(format!("prices[{i}]"), why))?;
            prices.push((p.backend.clone(), price));
        }
        if self.hold_ttl_s == 0 {
            return Err(err("hold_ttl_s".into(), "must be at least 1"));
        }
        if self.max_teams == 0 {
            return Err(err("max_teams".into(), "must be at least 1"));
        }
        let mode = self.mode()?;
        Ok(CompiledBudgets {
            mode,
            budgets,
            prices,
            hold_ttl_s: self.hold_ttl_s,
            default_max_tokens: self.default_max_tokens.max(1),
            max_teams: self.max_teams,
        })
    }

    /// The one mode the flags name. The test-only controls apply to embedded ledgers only;
    /// `per_request` is ignored with `service` (the shared ledger has its own lease option).
    fn mode(&self) -> Result<Mode, ConfigError> {
        let (charge_after, unheld) = self.test_controls();
        if let Some(service) = &self.service {
            if charge_after || unheld {
                return Err(err(
                    "service".into(),
                    "unsafe_charge_after and unsafe_worker_leases_unheld are for embedded ledgers",
                ));
            }
            let lease = match &service.lease {
                Some(l) => Some(l.compile().map_err(|(path, why)| err(path, why))?),
                None => None,
            };
            return Ok(Mode::Shared {
                service: ServiceConfig {
                    lease: None,
                    ..service.clone()
                },
                lease,
            });
        }
        Ok(match (charge_after, unheld, self.per_request) {
            (true, true, _) => {
                return Err(err(
                    "unsafe_charge_after".into(),
                    "one test control at a time",
                ))
            }
            (true, false, _) => Mode::Unsafe(UnsafeMode::ChargeAfter),
            (false, true, false) => Mode::Unsafe(UnsafeMode::WorkerLeasesUnheld),
            (false, true, true) => {
                return Err(err(
                    "unsafe_worker_leases_unheld".into(),
                    "only with worker leases (not per_request)",
                ))
            }
            (false, false, true) => Mode::PerRequest,
            (false, false, false) => Mode::WorkerLeases,
        })
    }
}

impl BudgetsConfig {
    /// `unsafe_charge_after` and `unsafe_worker_leases_unheld`: fields only a filter built with
    /// `test-controls` knows (the shipped one refuses them as unknown).
    #[cfg(feature = "test-controls")]
    fn test_controls(&self) -> (bool, bool) {
        (self.unsafe_charge_after, self.unsafe_worker_leases_unheld)
    }

    #[cfg(not(feature = "test-controls"))]
    fn test_controls(&self) -> (bool, bool) {
        (false, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<CompiledBudgets, String> {
        let c: BudgetsConfig = serde_json::from_str(json).map_err(|e| e.to_string())?;
        c.compile().map_err(|e| e.to_string())
    }

    #[test]
    fn compiles_scopes_caps_and_prices() {
        let c = parse(
            r#"{"budgets":[
                {"name":"all","scope":"router","max_tokens":1000,"window_s":60},
                {"name":"chat","scope":"rule","rule":"chat","max_usd":"2.5","window_s":3600},
                {"name":"teams","scope":"team","header":"X-Team","max_tokens":10,"max_usd":"1","window_s":1}],
              "prices":[{"backend":"gpt","prompt_usd":"0.15","completion_usd":"0.6"}]}"#,
        )
        .unwrap();
        assert_eq!(c.budgets[0].scope, Scope::Router);
        assert_eq!(c.budgets[1].scope, Scope::Rule("chat".into()));
        assert_eq!(c.budgets[1].caps.pico, Some(2_500_000_000_000));
        assert_eq!(
            c.budgets[2].scope,
            Scope::Team {
                header: "x-team".into()
            }
        );
        assert_eq!(
            c.price("gpt"),
            Price {
                prompt: 150_000,
                completion: 600_000
            }
        );
        assert_eq!(c.price("local"), Price::default());
        assert_eq!(
            (c.hold_ttl_s, c.default_max_tokens, c.max_teams),
            (900, 4096, 1024)
        );
        let team =
            parse(r#"{"budgets":[{"name":"t","scope":"team","max_tokens":1,"window_s":1}]}"#)
                .unwrap();
        assert_eq!(
            team.budgets[0].scope,
            Scope::Team {
                header: DEFAULT_TEAM_HEADER.into()
            }
        );
    }

    #[test]
    fn problems_name_the_field() {
        for (json, says) in [
            (
                r#"{"budgets":[{"name":"a","scope":"router","window_s":1}]}"#,
                "budgets[0].max_tokens: either",
            ),
            (
                r#"{"budgets":[{"name":"","scope":"router","max_tokens":1,"window_s":1}]}"#,
                "budgets[0].name",
            ),
            (
                r#"{"budgets":[{"name":"a","scope":"router","max_tokens":1,"window_s":1},{"name":"a","scope":"router","max_tokens":1,"window_s":1}]}"#,
                "budgets[1].name",
            ),
            (
                r#"{"budgets":[{"name":"a","scope":"rule","max_tokens":1,"window_s":1}]}"#,
                "budgets[0].rule",
            ),
            (
                r#"{"budgets":[{"name":"a","scope":"router","rule":"x","max_tokens":1,"window_s":1}]}"#,
                "budgets[0].rule: only",
            ),
            (
                r#"{"budgets":[{"name":"a","scope":"rule","rule":"x","header":"h","max_tokens":1,"window_s":1}]}"#,
                "budgets[0].header",
            ),
            (
                r#"{"budgets":[{"name":"a","scope":"router","max_usd":"1.2.3","window_s":1}]}"#,
                "budgets[0].max_usd",
            ),
            (
                r#"{"budgets":[{"name":"a","scope":"router","max_tokens":1,"window_s":0}]}"#,
                "budgets[0].window_s",
            ),
            (
                r#"{"budgets":[],"prices":[{"backend":"b","prompt_usd":"x"}]}"#,
                "prices[0]",
            ),
            (r#"{"budgets":[],"hold_ttl_s":0}"#, "hold_ttl_s"),
            (
                r#"{"budgets":[],"service":{"cluster":"c","lease":{"max_tokens":0}}}"#,
                "service.lease.max_tokens: must be at least 1",
            ),
            (r#"{"budgets":[],"bogus":1}"#, "unknown field"),
        ] {
            let e = parse(json).unwrap_err();
            assert!(e.contains(says), "{json}: {e}");
        }
    }

    /// Worker leases are what embedded ledgers get unless the configuration says `per_request`;
    /// the shared ledger and the test controls are modes of their own, and contradictory flags
    /// are refused instead of one silently winning.
    #[test]
    fn one_mode_per_router() {
        let b = r#""budgets":[{"name":"all","scope":"router","max_tokens":10,"window_s":60}]"#;
        let mode = |extra: &str| parse(&format!("{{{b}{extra}}}")).map(|c| c.mode);
        assert_eq!(mode(""), Ok(Mode::WorkerLeases));
        assert_eq!(mode(r#","per_request":true"#), Ok(Mode::PerRequest));
        assert_eq!(mode(r#","per_request":false"#), Ok(Mode::WorkerLeases));
        assert!(matches!(
            mode(r#","service":{"cluster":"c"}"#),
            Ok(Mode::Shared { lease: None, .. })
        ));
        assert!(matches!(
            mode(r#","service":{"cluster":"c","lease":{"max_tokens":5}}"#),
            Ok(Mode::Shared { lease: Some(_), .. })
        ));
        test_controls(&mode);
    }

    /// The test-only controls are modes of their own in a filter built for the tests…
    #[cfg(feature = "test-controls")]
    fn test_controls(mode: &dyn Fn(&str) -> Result<Mode, String>) {
        assert_eq!(
            mode(r#","unsafe_charge_after":true"#),
            Ok(Mode::Unsafe(UnsafeMode::ChargeAfter))
        );
        assert_eq!(
            mode(r#","unsafe_worker_leases_unheld":true"#),
            Ok(Mode::Unsafe(UnsafeMode::WorkerLeasesUnheld))
        );
        for bad in [
            r#","service":{"cluster":"c"},"unsafe_charge_after":true"#,
            r#","unsafe_charge_after":true,"unsafe_worker_leases_unheld":true"#,
            r#","per_request":true,"unsafe_worker_leases_unheld":true"#,
        ] {
            assert!(mode(bad).is_err(), "{bad}");
        }
    }

    /// …and unknown fields, refused, in the shipped one.
    #[cfg(not(feature = "test-controls"))]
    fn test_controls(mode: &dyn Fn(&str) -> Result<Mode, String>) {
        for control in [
            r#","unsafe_charge_after":true"#,
            r#","unsafe_worker_leases_unheld":true"#,
            r#","service":{"cluster":"c","lease":{"max_tokens":5,"unsafe_lease_unheld":true}}"#,
        ] {
            let e = mode(control).unwrap_err();
            assert!(e.contains("unknown field"), "{control}: {e}");
        }
    }
}
