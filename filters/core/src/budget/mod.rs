//! Token and USD budgets (`spec.policy.budgets`): exact ledgers and admission that cannot be
//! raced past a cap. See docs/budgets.md for the semantics and the bound.
//!
//! - [`config`]: the budgets configuration the generator writes, compiled for the filter.
//! - [`money`]: USD as integer pico-dollars, prices, the seed's status strings.
//! - [`window`]: rolling windows as bucketed counters that expire late, never early.
//! - [`ledger`]: one ledger (spent + held), reserve/settle/release, `Retry-After`, byte codec.
//! - [`admit`]: which ledgers a request is under, all-or-nothing reservation across them.
//! - [`bound`]: the request facts budgets read and the upper bound a request reserves.
//! - [`shared`]: ledgers in proxy-wasm shared data, compare-and-swap per update.
//! - [`table`]: the bounded directory of team ledgers kept in shared data.
//! - [`usage`], [`inject`]: usage from response bodies; asking streams for it
//!   (`usage_object` reads the counts of one captured `usage` object).
//! - [`wire`]: the JSON the filter and `llmkube-budgets` exchange.
//! - [`gauge`]: the newest state of each shared ledger across workers, for its gauges.
//! - [`remote`]: the calls the filter sends to `llmkube-budgets` and what their answers mean.
//! - [`lease`]: one lease's accounting (room, in flight, unreported use), for both lease modes.
//! - [`shared_lease`]: lease mode of the shared ledger: admission against a lease held in Redis.
//! - [`lease_slots`]: team leases: a fixed table of lease slots per team budget.
//! - [`worker_lease`]: worker leases over the embedded ledgers: admission in a worker's memory.
//! - [`reply`]: the 429 and 503 answers.
//! - [`ratelimit`]: the `x-ratelimit-*` headers of budgeted responses.
//! - [`plan`]: the budget step of one request: what to reserve where, what to charge.

pub mod admit;
pub mod bound;
pub mod compiled;
pub mod gauge;
pub mod inject;
pub mod lease;
pub mod lease_config;
pub mod lease_slots;
pub mod ledger;
pub mod money;
pub mod protocol;
pub mod ratelimit;
pub mod remote;
pub mod reply;
pub mod shared;
pub mod shared_lease;
pub mod step;
pub mod team_slots;
pub mod template;
#[cfg(test)]
mod test_store;
pub mod usage;
mod usage_object;
#[cfg(any(test, feature = "usage-oracle"))]
#[doc(hidden)]
pub mod usage_oracle;
pub mod usage_tail;
mod varint;
pub mod window;
pub mod worker_lease;

pub use admit::{admit_all, applicable, Budget, LedgerKey, LedgerStore, Refusal, Scope};
pub use ledger::{Caps, Hold, Ledger, Shape, Wait};
pub use money::Price;
pub use window::Amount;
