//! Cost marks: with the `cost-marks` feature (never in a shipped build) each mark is a
//! `proxy_log` at critical level named `cost-mark <what>`, so a host that counts the guest's
//! instructions at every hostcall (`request_cost`, `WASM_HOST_FUEL=1`) splits a callback into
//! its steps. Without the feature a mark compiles to nothing.

/// Marks the end of the step named `$what` (a string literal).
macro_rules! mark {
    ($what:literal) => {
        #[cfg(feature = "cost-marks")]
        filter_edge::log(filter_edge::Level::Critical, concat!("cost-mark ", $what));
    };
}

pub(crate) use mark;
