//! `policy.auth` in the plugin configuration: the header the verified team arrives in and
//! the allowlists, as the generator writes them (compiled by `crate::allow`).

use serde::{Deserialize, Serialize};

/// The plugin-config form: the team header and the entries, as the generator writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowConfig {
    /// Lower-cased header carrying the verified team.
    pub team_header: String,
    pub allowlists: Vec<AllowEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowEntry {
    pub team: String,
    /// Empty: every model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
}
