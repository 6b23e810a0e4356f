//! One emitter per gateway. Each target renders the same [`Ir`]; what a target cannot express
//! is refused (or warned about) by that target's own checks, before and after the IR is built.

pub mod agentgateway;
pub mod checks;
pub mod envoy;
pub mod envoy_gateway;
pub mod module;
pub mod quarantine;
pub mod xds;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use crate::inputs::{load, Inputs, Source};
use crate::ir::{self, CompileOptions, Ir};
use crate::model::ModelRouter;
use crate::validate::{validate_router, RefPolicy};
use crate::Diagnostics;

/// The listener a locally run gateway opens unless told otherwise (`--listen`).
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 10000);

/// `compile --target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Envoy,
    EnvoyGateway,
    Agentgateway,
}

impl Target {
    pub const ALL: [Target; 3] = [Target::Envoy, Target::EnvoyGateway, Target::Agentgateway];

    /// Why the target cannot serve `policy.auth` (verified JWT and allowlists), if it cannot.
    pub fn auth_unsupported(self) -> Option<&'static str> {
        match self {
            Target::Envoy | Target::EnvoyGateway => None,
            // Its route jwtAuth runs before extProc, but a route transformation (the only way to
            // copy a claim into a header) runs after it; the listener-level policies that run
            // before the route's are not generated or tested yet.
            Target::Agentgateway => Some("the verified team claim cannot reach the filter as the team header yet (agentgateway copies claims into headers with a transformation, which runs after the route's extProc); refusing rather than trusting a client-set team header"),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Target::Envoy => "envoy",
            Target::EnvoyGateway => "envoy-gateway",
            Target::Agentgateway => "agentgateway",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Target::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Target::ALL.iter().map(|t| t.as_str()).collect();
                format!("unknown target {s:?} ({})", names.join(", "))
            })
    }
}

/// A target's refusals and warnings: on the validated manifest (before the IR exists) and on the
/// IR (what its rendering cannot express).
pub trait TargetChecks {
    fn target(&self) -> Target;
    /// Whether every referenced Secret must be in the input (a target that inlines credentials).
    fn needs_secret_values(&self) -> bool;
    fn check_router(&self, router: &ModelRouter, diags: &mut Diagnostics);
    fn check_ir(&self, ir: &Ir, diags: &mut Diagnostics);
}

/// The front end every target shares: load, pick the router, validate (missing references are
/// errors here), the target's router checks, build the IR, the target's IR checks. `None` when
/// anything failed; the problems are in `diags`.
pub fn front_end(
    sources: &[Source],
    opts: &CompileOptions,
    checks: &dyn TargetChecks,
    diags: &mut Diagnostics,
) -> Option<Ir> {
    let inputs: Inputs = load(sources, diags);
    let target = checks.target();
    let router = ir::select_router(&inputs, opts.router.as_deref(), target.as_str(), diags)?;
    let refs = RefPolicy {
        missing_is_error: true,
        secrets_required: checks.needs_secret_values(),
        resolved_names: opts
            .resolve
            .keys()
            .chain(opts.endpoints.keys())
            .cloned()
            .collect(),
    };
    validate_router(router, &inputs, &refs, diags);
    checks.check_router(router, diags);
    if !diags.errors.is_empty() {
        return None;
    }
    let ir = ir::build(router, &inputs, opts, diags)?;
    checks.check_ir(&ir, diags);
    diags.errors.is_empty().then_some(ir)
}
