//! `spec.rules[]`: names, route backends, strategies, matches and the sensitive-data rules.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::backends::check_timeout;
use super::reporter::Ctx;
use super::syntax::*;
use crate::model::*;

pub(super) fn validate_rules(cx: &mut Ctx, spec: &ModelRouterSpec, cap: Duration) {
    let sensitive = spec.sensitive_classifications();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut catch_all: Option<usize> = None;
    for (i, r) in spec.rules.iter().enumerate() {
        let p = format!("spec.rules[{i}]");
        if !is_name(&r.name) {
            cx.err(
                format!("{p}.name"),
                format!("{:?} must match ^[a-z0-9][a-z0-9-]{{0,62}}$", r.name),
            );
        }
        if let Some(j) = seen.insert(&r.name, i) {
            cx.err(
                format!("{p}.name"),
                format!("duplicate rule name {:?} (also spec.rules[{j}])", r.name),
            );
        }
        if let Some(j) = catch_all {
            cx.warn(p.clone(), format!("unreachable: spec.rules[{j}] has no match conditions and matches every request first"));
        }
        let m = r.match_.clone().unwrap_or_default();
        if m.is_catch_all() && catch_all.is_none() {
            catch_all = Some(i);
        }
        let strategy = r.route.strategy.unwrap_or_default();
        if let Some(t) = &r.timeout {
            check_timeout(cx, &format!("{p}.timeout"), t, cap);
        }
        let declared = validate_route(cx, spec, &p, r, strategy);
        let mp = format!("{p}.match");
        validate_match(cx, &mp, &m, strategy);
        validate_sensitive(cx, spec, &p, r, &m, &sensitive);
        validate_capabilities(cx, &mp, &m, &declared);
    }
}

/// `route`: every backend declared, none twice, and what the strategy needs of them. Returns
/// the declared backends.
fn validate_route<'a>(
    cx: &mut Ctx,
    spec: &'a ModelRouterSpec,
    p: &str,
    r: &RouterRule,
    strategy: Strategy,
) -> Vec<&'a RouterBackend> {
    let rb = format!("{p}.route.backends");
    if r.route.backends.is_empty() {
        cx.err(rb.clone(), "at least one backend is required");
    }
    let mut in_rule = BTreeSet::new();
    let mut declared = Vec::new();
    for (j, name) in r.route.backends.iter().enumerate() {
        match spec.backend(name) {
            None => cx.err(
                format!("{rb}[{j}]"),
                format!("backend {name:?} is not declared in spec.backends"),
            ),
            Some(b) => declared.push(b),
        }
        if !in_rule.insert(name.as_str()) {
            cx.err(
                format!("{rb}[{j}]"),
                format!("backend {name:?} is listed twice"),
            );
        }
    }
    match strategy {
        Strategy::Weighted => {
            if !declared.is_empty() && declared.iter().all(|b| b.effective_weight() <= 0) {
                cx.err(
                    format!("{p}.route.strategy"),
                    "a weighted rule needs at least one backend with a positive weight",
                );
            }
        }
        Strategy::Shadow => {
            if r.route.backends.len() < 2 {
                cx.err(
                    format!("{p}.route.backends"),
                    "the shadow strategy needs at least two backends",
                );
            }
        }
        Strategy::PrimaryFallback => {}
    }
    declared
}

/// `match`: header names, model globs, the latency SLO and the classifications.
fn validate_match(cx: &mut Ctx, mp: &str, m: &RuleMatch, strategy: Strategy) {
    let mut lower_names = BTreeMap::new();
    for k in m.headers.keys() {
        cx.header(&format!("{mp}.headers.{k}"), k);
        if let Some(prev) = lower_names.insert(k.to_ascii_lowercase(), k) {
            cx.err(
                format!("{mp}.headers.{k}"),
                format!("duplicates header {prev:?} (names are case-insensitive)"),
            );
        }
    }
    for (j, g) in m.models.iter().enumerate() {
        if let Err(e) = check_glob(g) {
            cx.err(format!("{mp}.models[{j}]"), e);
        }
    }
    if let Some(l) = m.latency_slo_ms {
        if cx.range(&format!("{mp}.latencySLOMs"), l, 1, i32::MAX as i64)
            && strategy != Strategy::PrimaryFallback
        {
            cx.warn(
                format!("{mp}.latencySLOMs"),
                "is honored only by the primary-fallback strategy",
            );
        }
    }
    for (j, c) in m.data_classification.iter().enumerate() {
        if c.trim().is_empty() {
            cx.err(format!("{mp}.dataClassification[{j}]"), "must not be empty");
        }
    }
}

/// A rule matching a sensitive classification fails closed and routes only to local backends;
/// so does any fail-closed rule.
fn validate_sensitive(
    cx: &mut Ctx,
    spec: &ModelRouterSpec,
    p: &str,
    r: &RouterRule,
    m: &RuleMatch,
    sensitive: &[String],
) {
    let rb = format!("{p}.route.backends");
    let sensitive_hit: Vec<&String> = m
        .data_classification
        .iter()
        .filter(|c| sensitive.contains(&c.to_ascii_lowercase()))
        .collect();
    if let Some(first) = sensitive_hit.first() {
        if r.fail_closed != Some(true) {
            cx.err(
                format!("{p}.failClosed"),
                format!(
                    "rule matches sensitive classification {:?} and must set failClosed: true",
                    first.to_ascii_lowercase()
                ),
            );
        }
        for (j, name) in r.route.backends.iter().enumerate() {
            if let Some(b) = spec.backend(name) {
                if b.effective_tier() != Tier::Local {
                    cx.err(
                        format!("{rb}[{j}]"),
                        format!(
                            "rule matches sensitive classification {:?} and may only route to tier: local backends; {name:?} is cloud{}",
                            first.to_ascii_lowercase(),
                            if b.tier.is_none() { " (external backends default to tier: cloud)" } else { "" }
                        ),
                    );
                }
            }
        }
    } else if r.fail_closed == Some(true) {
        for (j, name) in r.route.backends.iter().enumerate() {
            if spec
                .backend(name)
                .is_some_and(|b| b.effective_tier() != Tier::Local)
            {
                cx.err(format!("{rb}[{j}]"), format!("fail-closed rules can only route to tier: local backends; {name:?} is cloud"));
            }
        }
    }
}

/// `match.requiredCapabilities`: some backend of the route must advertise them all.
fn validate_capabilities(cx: &mut Ctx, mp: &str, m: &RuleMatch, declared: &[&RouterBackend]) {
    if !m.required_capabilities.is_empty() && !declared.is_empty() {
        let ok = declared.iter().any(|b| {
            m.required_capabilities
                .iter()
                .all(|c| b.capabilities.contains(c))
        });
        if !ok {
            cx.err(
                format!("{mp}.requiredCapabilities"),
                format!(
                    "no backend of the route advertises all of {:?}; the rule could never match",
                    m.required_capabilities
                ),
            );
        }
    }
}
