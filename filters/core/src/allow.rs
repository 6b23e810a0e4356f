//! `policy.auth.allowlists`: which verified team may reach which model.
//!
//! The team is the value the gateway's JWT step wrote into the team header (`jwt.headerKey`)
//! after removing whatever the client sent under that name; this module only reads it. With
//! allowlists set the default is deny: a request without exactly one team value, a team no entry
//! names, or a model the team's entry does not list is refused with 403 `model_not_allowed`
//! before routing, budgets or any upstream work. An entry without models lets its team reach
//! every model. Model patterns use the rules' glob syntax (`qwen3-*`); one without
//! metacharacters is an exact name.

use crate::glob::Glob;

pub use crate::config::auth::{AllowConfig, AllowEntry};

/// Entries beyond this are refused at config load (the lookup is a linear scan per request).
pub const MAX_ENTRIES: usize = 1024;

/// The compiled allowlists.
#[derive(Debug)]
pub struct Allowlists {
    team_header: String,
    /// (team, model patterns); no patterns: every model.
    entries: Vec<(String, Vec<Glob>)>,
}

/// Why a request is not allowed, for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    NoTeam,
    SeveralTeams,
    UnknownTeam,
    Model,
}

impl Allowlists {
    /// Compiles the config; an empty team, a team listed twice, a bad pattern or too many
    /// entries is an error (the filter refuses to start rather than guess).
    pub fn new(cfg: &AllowConfig) -> Result<Allowlists, String> {
        if cfg.allowlists.len() > MAX_ENTRIES {
            return Err(format!(
                "auth: {} allowlist entries (at most {MAX_ENTRIES})",
                cfg.allowlists.len()
            ));
        }
        let mut entries: Vec<(String, Vec<Glob>)> = Vec::with_capacity(cfg.allowlists.len());
        for e in &cfg.allowlists {
            if e.team.is_empty() {
                return Err("auth: an allowlist entry has an empty team".into());
            }
            if entries.iter().any(|(t, _)| *t == e.team) {
                return Err(format!("auth: team {:?} is listed twice", e.team));
            }
            let mut globs = Vec::with_capacity(e.models.len());
            for m in &e.models {
                globs.push(Glob::new(m).map_err(|err| format!("auth: team {:?}: {err}", e.team))?);
            }
            entries.push((e.team.clone(), globs));
        }
        Ok(Allowlists {
            team_header: cfg.team_header.to_ascii_lowercase(),
            entries,
        })
    }

    /// The header the team is read from (lower-cased).
    pub fn team_header(&self) -> &str {
        &self.team_header
    }

    /// Whether `team` (every value the request carries under the team header) may reach `model`.
    pub fn decide<'a>(
        &self,
        mut teams: impl Iterator<Item = &'a str>,
        model: &str,
    ) -> Result<(), Denied> {
        let team = match (teams.next(), teams.next()) {
            (None, _) => return Err(Denied::NoTeam),
            (Some(_), Some(_)) => return Err(Denied::SeveralTeams),
            (Some(t), None) => t,
        };
        let Some((_, models)) = self.entries.iter().find(|(t, _)| t == team) else {
            return Err(Denied::UnknownTeam);
        };
        if models.is_empty() || models.iter().any(|g| g.matches(model)) {
            Ok(())
        } else {
            Err(Denied::Model)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Outcome;
    use crate::router::RequestHeaders;

    fn lists() -> Allowlists {
        Allowlists::new(&AllowConfig {
            team_header: "X-LLMKube-Team".into(),
            allowlists: vec![
                AllowEntry {
                    team: "research".into(),
                    models: vec!["qwen3-*".into(), "llama".into()],
                },
                AllowEntry {
                    team: "ops".into(),
                    models: vec![],
                },
            ],
        })
        .unwrap()
    }

    fn headers(teams: &[&str]) -> RequestHeaders {
        let mut h = RequestHeaders::new();
        for t in teams {
            h.push("x-llmkube-team".into(), t.to_string());
        }
        h
    }

    #[test]
    fn listed_models_and_globs_are_allowed_others_denied() {
        let a = lists();
        assert_eq!(a.team_header(), "x-llmkube-team");
        let d = |teams: &[&str], model: &str| a.decide(teams.iter().copied(), model);
        assert_eq!(d(&["research"], "qwen3-8b"), Ok(()));
        assert_eq!(d(&["research"], "llama"), Ok(()));
        assert_eq!(d(&["research"], "llama-2"), Err(Denied::Model));
        assert_eq!(d(&["research"], "gpt-5"), Err(Denied::Model));
        assert_eq!(d(&["ops"], "anything/at-all"), Ok(()), "no models: all");
        assert_eq!(d(&["Research"], "llama"), Err(Denied::UnknownTeam));
        assert_eq!(d(&["intruder"], "llama"), Err(Denied::UnknownTeam));
        assert_eq!(d(&[], "llama"), Err(Denied::NoTeam));
        assert_eq!(d(&["ops", "ops"], "llama"), Err(Denied::SeveralTeams));
        assert_eq!(d(&[""], "llama"), Err(Denied::UnknownTeam));
    }

    #[test]
    fn a_refusal_is_403_model_not_allowed_naming_team_and_model() {
        let a = lists();
        let r = a.check(&headers(&["research"]), "gpt-5").unwrap_err();
        assert_eq!(
            (r.error.status, r.error.kind, r.error.code, r.outcome),
            (
                403,
                "permission_error",
                "model_not_allowed",
                Outcome::NotAllowed
            )
        );
        assert!(
            r.error.message.contains("\"research\""),
            "{}",
            r.error.message
        );
        assert!(r.error.message.contains("\"gpt-5\""), "{}", r.error.message);
        let r = a.check(&headers(&[]), "llama").unwrap_err();
        assert!(
            r.error.message.contains("x-llmkube-team"),
            "{}",
            r.error.message
        );
        assert_eq!(r.error.status, 403);
        let r = a
            .check(&headers(&["ops", "research"]), "llama")
            .unwrap_err();
        assert_eq!(r.error.status, 403);
        assert!(a.check(&headers(&["ops"]), "llama").is_ok());
    }

    #[test]
    fn bad_configs_are_refused() {
        let cfg = |entries: Vec<(&str, Vec<&str>)>| AllowConfig {
            team_header: "x-llmkube-team".into(),
            allowlists: entries
                .into_iter()
                .map(|(t, m)| AllowEntry {
                    team: t.into(),
                    models: m.into_iter().map(String::from).collect(),
                })
                .collect(),
        };
        assert!(Allowlists::new(&cfg(vec![("", vec![])])).is_err());
        assert!(Allowlists::new(&cfg(vec![("a", vec![]), ("a", vec!["m"])])).is_err());
        assert!(Allowlists::new(&cfg(vec![("a", vec!["[unclosed"])])).is_err());
        let many = (0..=MAX_ENTRIES)
            .map(|i| format!("t{i}"))
            .collect::<Vec<_>>();
        let too_many = cfg(many.iter().map(|t| (t.as_str(), vec![])).collect());
        assert!(Allowlists::new(&too_many).is_err());
        assert!(Allowlists::new(&cfg(vec![("a", vec![]), ("b", vec!["m*"])])).is_ok());
    }

    #[test]
    fn the_router_compiles_them_and_reads_the_team_header() {
        let raw = br#"{"router":"r","backends":[{"name":"a"}],
            "auth":{"team_header":"X-Team","allowlists":[{"team":"t","models":["a"]}]}}"#;
        let r = crate::router::Router::from_json(raw).unwrap();
        assert!(r.needed_headers().iter().any(|h| h == "x-team"));
        assert!(
            !r.config.stamped_headers().iter().any(|h| h == "x-team"),
            "the filter must not strip the header the JWT step wrote"
        );
        let mut h = RequestHeaders::new();
        h.push("x-team".into(), "t".into());
        assert!(r.allowlists().unwrap().check(&h, "a").is_ok());
        assert!(r.allowlists().unwrap().check(&h, "b").is_err());
        let plain =
            crate::router::Router::from_json(br#"{"router":"r","backends":[{"name":"a"}]}"#)
                .unwrap();
        assert!(plain.allowlists().is_none());
        let dup = br#"{"router":"r","backends":[{"name":"a"}],
            "auth":{"team_header":"x","allowlists":[{"team":"t"},{"team":"t"}]}}"#;
        assert!(crate::router::Router::from_json(dup).is_err());
    }
}
