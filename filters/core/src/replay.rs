//! Failover under a gateway that replays only small bodies.
//!
//! agentgateway keeps at most 64 KiB of a request body for another attempt (retries, failover
//! between priority groups); a larger request gets one attempt, at the first backend that is
//! not evicted. A router compiled to accept that (`PluginConfig::failover_replay_limit`) still
//! fails over every request up to the limit; each larger one whose attempt order has more than
//! one backend is counted and audited as `failover_skipped`, so the trade is visible per request.

/// Whether a request of `body_len` bytes with an attempt order of `order_len` backends is
/// served by its first backend only under replay limit `limit` (`None`: no limit).
pub fn failover_skipped(limit: Option<u64>, order_len: usize, body_len: u64) -> bool {
    order_len > 1 && limit.is_some_and(|l| body_len > l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_body_over_the_limit_with_alternatives_skips_failover() {
        const L: u64 = 64 * 1024;
        assert!(!failover_skipped(None, 3, u64::MAX));
        assert!(!failover_skipped(Some(L), 2, L));
        assert!(failover_skipped(Some(L), 2, L + 1));
        assert!(
            !failover_skipped(Some(L), 1, L + 1),
            "one backend: nothing to skip"
        );
        assert!(!failover_skipped(Some(L), 0, L + 1));
    }
}
