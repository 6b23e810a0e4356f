//! The validation context: where one router's problems are reported, and the checks of a
//! duration, a range and a header name every part of the spec uses.

use std::time::Duration;

use router_core::headers::is_token as is_header_token;

use crate::duration::parse_duration;
use crate::{Diagnostics, Problem};

/// Where one router's problems go (labelled with the router), and the checks every part of
/// the validation shares.
pub(crate) struct Ctx<'a> {
    pub(super) label: String,
    pub(super) diags: &'a mut Diagnostics,
}

impl Ctx<'_> {
    pub(crate) fn err(&mut self, path: impl Into<String>, msg: impl Into<String>) {
        self.diags.error(Problem::new(&self.label, path, msg));
    }
    pub(crate) fn warn(&mut self, path: impl Into<String>, msg: impl Into<String>) {
        self.diags.warn(Problem::new(&self.label, path, msg));
    }
    pub(crate) fn duration(&mut self, path: &str, s: &str) -> Option<Duration> {
        match parse_duration(s) {
            Ok(d) => Some(d),
            Err(e) => {
                self.err(path, e);
                None
            }
        }
    }
    pub(crate) fn range(&mut self, path: &str, v: i64, min: i64, max: i64) -> bool {
        if v < min || v > max {
            self.err(path, format!("must be between {min} and {max}, got {v}"));
            false
        } else {
            true
        }
    }
    pub(crate) fn header(&mut self, path: &str, name: &str) {
        if !is_header_token(name) {
            self.err(
                path,
                format!("{name:?} is not a valid HTTP header name (RFC 7230 token)"),
            );
        }
    }
}
