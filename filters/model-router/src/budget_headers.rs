//! Sends the rate-limit headers of a budgeted response (`router_core::budget::ratelimit`).

use filter_edge::{self as edge, Level, Map};
use router_core::budget::ratelimit::RateLimit;

/// Sets the headers on the response going to the client. A header that cannot be set is
/// logged and left out: the response itself goes on.
pub(crate) fn send(rate: &RateLimit) {
    rate.each_header(|name, value| {
        if let Err(e) = edge::set_header(Map::ResponseHeaders, name, value) {
            edge::log(
                Level::Warn,
                &format!("model-router: budgets: setting {name}: {e}"),
            );
        }
    });
}
