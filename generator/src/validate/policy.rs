//! `spec.policy`: classification, audit log, auth and budgets.

use std::collections::BTreeMap;

use super::syntax::*;
use router_core::headers::{is_token, CREDENTIAL_HEADERS};

use super::reporter::Ctx;
use crate::model::*;

pub(super) fn validate_policy(cx: &mut Ctx, spec: &ModelRouterSpec) {
    let Some(policy) = &spec.policy else { return };
    if let Some(c) = &policy.classification {
        validate_classification(cx, c);
    }
    if let Some(a) = &policy.audit_log {
        validate_audit_log(cx, a);
    }
    if let Some(auth) = &policy.auth {
        validate_auth(cx, auth);
    }
    validate_budgets(cx, spec, &policy.budgets);
}

/// `policy.classification`: the header and mode (only header-only is implemented).
fn validate_classification(cx: &mut Ctx, c: &Classification) {
    if let Some(h) = &c.header_key {
        cx.header("spec.policy.classification.headerKey", h);
    }
    match c.mode.unwrap_or_default() {
        ClassificationMode::HeaderOnly => {}
        m @ (ClassificationMode::Detector | ClassificationMode::Hybrid) => cx.err(
            "spec.policy.classification.mode",
            format!(
                "ClassifierNotImplemented: mode {:?} is reserved for a future content classifier; only header-only is implemented",
                if m == ClassificationMode::Detector { "detector" } else { "hybrid" }
            ),
        ),
    }
    if let Some(list) = &c.sensitive_classifications {
        for (i, s) in list.iter().enumerate() {
            if s.trim().is_empty() {
                cx.err(
                    format!("spec.policy.classification.sensitiveClassifications[{i}]"),
                    "must not be empty",
                );
            }
        }
    }
}

/// `policy.auditLog`: the caller header (never a credential) and whose forwarded address is
/// believed.
fn validate_audit_log(cx: &mut Ctx, a: &AuditLog) {
    if let Some(h) = &a.caller_header {
        let p = "spec.policy.auditLog.callerHeader";
        if h.len() > 64 {
            cx.err(p, format!("at most 64 characters, got {}", h.len()));
        }
        if !is_token(h) {
            cx.err(
                p,
                format!("{h:?} is not a valid HTTP header name (RFC 7230 token)"),
            );
        } else if CREDENTIAL_HEADERS.contains(&h.to_ascii_lowercase().as_str()) {
            cx.err(
                p,
                format!("{h:?} carries a credential and cannot be logged as caller"),
            );
        }
    }
    if let Some(cidrs) = &a.trusted_proxy_cidrs {
        if cidrs.len() > 32 {
            cx.err(
                "spec.policy.auditLog.trustedProxyCIDRs",
                format!("at most 32 entries, got {}", cidrs.len()),
            );
        }
        for (i, c) in cidrs.iter().enumerate() {
            if !is_cidr_or_addr(c) {
                cx.err(
                    format!("spec.policy.auditLog.trustedProxyCIDRs[{i}]"),
                    format!("{c:?} is not a CIDR or an IP address"),
                );
            }
        }
        if !cidrs.is_empty() && a.log_client_address != Some(true) {
            cx.err(
                "spec.policy.auditLog.trustedProxyCIDRs",
                "requires logClientAddress: true",
            );
        }
    }
    if a.file_path.is_some() && a.sink != Some(AuditSink::File) {
        cx.warn(
            "spec.policy.auditLog.filePath",
            "is used only with sink: file",
        );
    }
}

/// `policy.auth`: the JWT step and the allowlists it makes possible.
fn validate_auth(cx: &mut Ctx, auth: &Auth) {
    if let Some(j) = &auth.jwt {
        for (f, v) in [
            ("issuer", &j.issuer),
            ("jwksURI", &j.jwks_uri),
            ("provider", &j.provider),
            ("teamClaim", &j.team_claim),
        ] {
            if v.is_empty() {
                cx.err(format!("spec.policy.auth.jwt.{f}"), "must not be empty");
            }
        }
        if let Some(h) = &j.header_key {
            cx.header("spec.policy.auth.jwt.headerKey", h);
            let lower = h.to_ascii_lowercase();
            let decision = router_core::headers::DECISION_HEADERS.contains(&lower.as_str())
                || lower == router_core::config::DEFAULT_MODEL_HEADER;
            if decision || CREDENTIAL_HEADERS.contains(&lower.as_str()) {
                cx.err(
                    "spec.policy.auth.jwt.headerKey",
                    format!("{h:?} is a credential or decision header; the verified team needs a header of its own"),
                );
            }
        }
        if !j.jwks_uri.is_empty() {
            if let Err(e) = crate::url::parse_url(&j.jwks_uri) {
                cx.err("spec.policy.auth.jwt.jwksURI", e);
            }
        }
    }
    if !auth.allowlists.is_empty() && auth.jwt.is_none() {
        cx.err(
            "spec.policy.auth.allowlists",
            "authorization requires authentication: set spec.policy.auth.jwt",
        );
    }
    let mut teams = BTreeMap::new();
    for (i, a) in auth.allowlists.iter().enumerate() {
        if a.team.is_empty() {
            cx.err(
                format!("spec.policy.auth.allowlists[{i}].team"),
                "must not be empty",
            );
        } else if let Some(j) = teams.insert(a.team.as_str(), i) {
            cx.err(
                format!("spec.policy.auth.allowlists[{i}].team"),
                format!("duplicate team {:?} (also allowlists[{j}])", a.team),
            );
        }
    }
}

/// `policy.budgets`: names, caps, windows and what each scope needs.
fn validate_budgets(cx: &mut Ctx, spec: &ModelRouterSpec, budgets: &[Budget]) {
    let mut names = BTreeMap::new();
    for (i, b) in budgets.iter().enumerate() {
        let p = format!("spec.policy.budgets[{i}]");
        if !is_name(&b.name) {
            cx.err(
                format!("{p}.name"),
                format!("{:?} must match ^[a-z0-9][a-z0-9-]{{0,62}}$", b.name),
            );
        }
        if let Some(j) = names.insert(b.name.as_str(), i) {
            cx.err(
                format!("{p}.name"),
                format!(
                    "duplicate budget name {:?} (also spec.policy.budgets[{j}])",
                    b.name
                ),
            );
        }
        if b.max_tokens.is_none() && b.max_usd.is_none() {
            cx.err(
                p.clone(),
                "either maxTokens or maxUSD (or both) must be set",
            );
        }
        if let Some(t) = b.max_tokens {
            cx.range(&format!("{p}.maxTokens"), t, 1, i64::MAX);
        }
        if let Some(u) = &b.max_usd {
            if !is_decimal(u) {
                cx.err(
                    format!("{p}.maxUSD"),
                    format!("{u:?} must match ^[0-9]+(\\.[0-9]+)?$"),
                );
            }
        }
        if let Some(w) = b.window_seconds {
            cx.range(&format!("{p}.windowSeconds"), w, 1, i32::MAX as i64);
        }
        if let Some(h) = &b.header_key {
            cx.header(&format!("{p}.headerKey"), h);
        }
        match b.scope {
            BudgetScope::Rule => match &b.rule_name {
                None => cx.err(format!("{p}.ruleName"), "is required when scope is rule"),
                Some(r) if !spec.rules.iter().any(|x| &x.name == r) => cx.err(
                    format!("{p}.ruleName"),
                    format!("rule {r:?} is not declared in spec.rules"),
                ),
                Some(_) => {}
            },
            _ => {
                if b.rule_name.is_some() {
                    cx.warn(format!("{p}.ruleName"), "is used only when scope is rule");
                }
            }
        }
        if b.header_key.is_some() && b.scope != BudgetScope::Team {
            cx.warn(format!("{p}.headerKey"), "is used only when scope is team");
        }
    }
}
