//! Backend attempt orders and the route keys that name them.
//!
//! Envoy fails a request over across clusters only inside an aggregate cluster, whose member
//! order is fixed in config. So the filter picks an *order* per request and stamps it as a route
//! key; the generator emits one route (and aggregate) per order the filter can ever produce. Both
//! sides call `rule_orders`, so they cannot disagree.
//!
//! Weighted rules draw a weighted random permutation (successive sampling without replacement,
//! each step proportional to weight). Envoy then skips quarantined members in that order, and the
//! first healthy member of a weighted permutation is distributed in proportion to weight among
//! the healthy ones: exactly the ModelRouter spec's "proportional among healthy backends". Failover goes to
//! the next member, never the same one twice. Weight 0 never enters the permutation (drained).

use crate::config::{Strategy, Tier};

/// Above this many positive-weight backends a weighted rule no longer enumerates every
/// permutation (n! routes); it draws the first backend by weight and fails over in declared
/// order (n routes).
pub const MAX_PERMUTED: usize = 4;

/// Orders up to this long also get a route for every shortened form (quarantined backends left
/// out, see `quarantine`): 2^n - 1 routes for n backends in declared order, all 64 arrangements
/// of 4 weighted ones. Longer orders keep their quarantined members and rely on Envoy's.
pub const MAX_SKIPPABLE: usize = 6;

/// Route key for requests no rule matched (BackendNameMatch or the default route).
pub const UNRULED: &str = "~";

/// `<rule>/<b1>,<b2>,...`; rule and backend names are DNS labels, so '/' and ',' cannot clash.
/// `order` is walked twice (the length, then the names) so the key is one allocation of its
/// exact size, with no list of the names collected first.
pub fn route_key<S: AsRef<str>>(
    rule: &str,
    order: impl IntoIterator<Item = S, IntoIter: Clone>,
) -> String {
    let order = order.into_iter();
    let len = order.clone().map(|b| b.as_ref().len() + 1).sum::<usize>();
    let mut key = String::with_capacity(rule.len() + 1 + len);
    key.push_str(rule);
    key.push('/');
    for (i, b) in order.enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(b.as_ref());
    }
    key
}

/// What a rule's orders are built from.
pub struct OrderInput<'a> {
    pub strategy: Strategy,
    /// The rule's backends that may serve it (capabilities already applied), declared order.
    pub candidates: &'a [usize],
    /// Tier and weight of every backend, by backend index.
    pub tiers: &'a [Tier],
    pub weights: &'a [u32],
}

/// Backends allowed for this request, in declared order: only local ones when it is sensitive,
/// and for weighted rules only positive weights.
fn allowed(input: &OrderInput<'_>, sensitive: bool) -> Vec<usize> {
    input
        .candidates
        .iter()
        .copied()
        .filter(|&b| !sensitive || input.tiers[b] == Tier::Local)
        .filter(|&b| input.strategy != Strategy::Weighted || input.weights[b] > 0)
        .collect()
}

/// The order for one request. `healthy` says which backends may be tried now (the filter's own
/// quarantine); it is only applied to pools of up to `MAX_SKIPPABLE`, the orders the route table
/// has shortened forms for. `random` yields uniformly distributed u64s. Empty means no backend
/// may serve this request under this rule.
pub fn pick_order(
    input: &OrderInput<'_>,
    sensitive: bool,
    healthy: &dyn Fn(usize) -> bool,
    random: &mut dyn FnMut() -> u64,
) -> Vec<usize> {
    let mut pool = allowed(input, sensitive);
    if pool.len() <= MAX_SKIPPABLE {
        pool.retain(|&b| healthy(b));
    }
    if input.strategy != Strategy::Weighted || pool.len() <= 1 {
        return pool;
    }
    let permute_all = pool.len() <= MAX_PERMUTED;
    let mut order = Vec::with_capacity(pool.len());
    while !pool.is_empty() {
        let total: u64 = pool.iter().map(|&b| input.weights[b] as u64).sum();
        let mut ticket = random() % total.max(1);
        let mut idx = pool.len() - 1;
        for (i, &b) in pool.iter().enumerate() {
            let w = input.weights[b] as u64;
            if ticket < w {
                idx = i;
                break;
            }
            ticket -= w;
        }
        order.push(pool.remove(idx));
        if !permute_all {
            // First pick by weight; the rest fail over in declared order.
            order.append(&mut pool);
        }
    }
    order
}

/// Every order the filter can stamp for this rule: what `pick_order` can return, sensitive or
/// not, and each of those with any quarantined members left out; deduplicated, sorted.
pub fn all_orders(input: &OrderInput<'_>) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for order in picked_orders(input) {
        if order.len() <= MAX_SKIPPABLE {
            // Every non-empty subsequence, by bitmask over positions (order kept).
            for mask in 1u32..(1u32 << order.len()) {
                out.push(
                    order
                        .iter()
                        .enumerate()
                        .filter(|&(i, _)| mask & (1 << i) != 0)
                        .map(|(_, &b)| b)
                        .collect(),
                );
            }
        } else {
            out.push(order);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Every order `pick_order` can return for this rule, sensitive or not.
fn picked_orders(input: &OrderInput<'_>) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for sensitive in [false, true] {
        let pool = allowed(input, sensitive);
        if pool.is_empty() {
            continue;
        }
        if input.strategy != Strategy::Weighted || pool.len() <= 1 {
            out.push(pool);
        } else if pool.len() <= MAX_PERMUTED {
            permutations(&pool, &mut Vec::new(), &mut out);
        } else {
            for (i, &first) in pool.iter().enumerate() {
                let mut o = vec![first];
                o.extend(
                    pool.iter()
                        .enumerate()
                        .filter(|&(j, _)| j != i)
                        .map(|(_, &b)| b),
                );
                out.push(o);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn permutations(rest: &[usize], prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    if rest.is_empty() {
        out.push(prefix.clone());
        return;
    }
    for i in 0..rest.len() {
        prefix.push(rest[i]);
        let remaining: Vec<usize> = rest
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, &b)| b)
            .collect();
        permutations(&remaining, prefix, out);
        prefix.pop();
    }
}

/// A small, fast PRNG (wyrand) for weighted picks; seeded once per VM from the host's entropy.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        ((t >> 64) ^ t) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_keys() {
        assert_eq!(route_key("r", &["a", "b"]), "r/a,b");
        assert_eq!(route_key(UNRULED, &["a"]), "~/a");
    }

    #[test]
    fn primary_fallback_keeps_declared_order_and_drops_cloud_for_sensitive() {
        let tiers = [Tier::Cloud, Tier::Local, Tier::Local];
        let weights = [1, 1, 1];
        let inp = OrderInput {
            strategy: Strategy::PrimaryFallback,
            candidates: &[0, 1, 2],
            tiers: &tiers,
            weights: &weights,
        };
        let mut r = Rng::new(1);
        assert_eq!(
            pick_order(&inp, false, &|_| true, &mut || r.next_u64()),
            vec![0, 1, 2]
        );
        assert_eq!(
            pick_order(&inp, true, &|_| true, &mut || r.next_u64()),
            vec![1, 2]
        );
        // Both picks and every shortened form a quarantine can produce, in declared order.
        assert_eq!(
            all_orders(&inp),
            vec![
                vec![0],
                vec![0, 1],
                vec![0, 1, 2],
                vec![0, 2],
                vec![1],
                vec![1, 2],
                vec![2]
            ]
        );
    }

    #[test]
    fn weighted_picks_follow_weights_and_every_pick_is_enumerated() {
        let tiers = [Tier::Local; 4];
        let weights = [3, 1, 0, 6];
        let inp = OrderInput {
            strategy: Strategy::Weighted,
            candidates: &[0, 1, 2, 3],
            tiers: &tiers,
            weights: &weights,
        };
        let all = all_orders(&inp);
        assert_eq!(
            all.len(),
            15,
            "every arrangement of every non-empty subset of the 3 positive-weight backends"
        );
        assert!(
            all.iter().all(|o| !o.contains(&2)),
            "weight 0 never appears"
        );
        let mut r = Rng::new(42);
        let mut first = [0u32; 4];
        let n = 100_000;
        for _ in 0..n {
            let o = pick_order(&inp, false, &|_| true, &mut || r.next_u64());
            assert!(all.contains(&o), "{o:?} not enumerated");
            assert!(!o.contains(&2), "weight 0 is drained");
            first[o[0]] += 1;
        }
        // Expected shares 0.3 / 0.1 / 0 / 0.6; with n = 100k the standard error is < 0.0016.
        let share = |i: usize| first[i] as f64 / n as f64;
        assert!((share(0) - 0.3).abs() < 0.01, "{first:?}");
        assert!((share(1) - 0.1).abs() < 0.01, "{first:?}");
        assert!((share(3) - 0.6).abs() < 0.01, "{first:?}");
        // Second place, given backend 3 went first: 0 and 1 in ratio 3:1.
    }

    #[test]
    fn many_weighted_backends_enumerate_first_picks_only() {
        let tiers = [Tier::Local; 6];
        let weights = [1; 6];
        let cands = [0, 1, 2, 3, 4, 5];
        let inp = OrderInput {
            strategy: Strategy::Weighted,
            candidates: &cands,
            tiers: &tiers,
            weights: &weights,
        };
        let all = all_orders(&inp);
        // Each subset S of the 6 has |S| orders (any member first, the rest declared): 6 * 2^5.
        assert_eq!(all.len(), 192);
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            assert!(all.contains(&pick_order(&inp, false, &|_| true, &mut || r.next_u64())));
        }
    }

    #[test]
    fn orders_longer_than_skippable_are_not_shortened() {
        // Neither in the route table nor at pick time (the table has no route for it).
        let n = MAX_SKIPPABLE + 1;
        let tiers = vec![Tier::Local; n];
        let weights = vec![1; n];
        let cands: Vec<usize> = (0..n).collect();
        let inp = OrderInput {
            strategy: Strategy::PrimaryFallback,
            candidates: &cands,
            tiers: &tiers,
            weights: &weights,
        };
        assert_eq!(all_orders(&inp), vec![cands.clone()]);
        let mut r = Rng::new(1);
        assert_eq!(
            pick_order(&inp, false, &|b| b != 0, &mut || r.next_u64()),
            cands
        );
    }

    #[test]
    fn every_shortened_pick_has_a_route() {
        // What the filter does at run time (pick, then leave quarantined members out) must
        // always land on an enumerated order.
        let tiers = [Tier::Local, Tier::Cloud, Tier::Local, Tier::Local];
        let weights = [2, 1, 1, 5];
        for strategy in [
            Strategy::PrimaryFallback,
            Strategy::Weighted,
            Strategy::Shadow,
        ] {
            let inp = OrderInput {
                strategy,
                candidates: &[0, 1, 2, 3],
                tiers: &tiers,
                weights: &weights,
            };
            let all = all_orders(&inp);
            let mut r = Rng::new(3);
            for round in 0..2000u64 {
                let sensitive = round % 2 == 0;
                let mut q = crate::quarantine::Quarantine::new(4);
                for b in 0..4 {
                    if (round >> (b + 1)) & 1 == 1 {
                        q.mark(b, 10);
                    }
                }
                let healthy = |b: usize| !q.is_quarantined(b, 0);
                let o = pick_order(&inp, sensitive, &healthy, &mut || r.next_u64());
                assert!(o.iter().all(|&b| healthy(b)), "{o:?}");
                assert!(o.is_empty() || all.contains(&o), "{strategy:?} {o:?}");
            }
        }
    }
}
