//! Which ledgers a request is under, and all-or-nothing admission against all of them.

use super::ledger::{Caps, Hold, Ledger, Shape, Wait};
use super::window::Amount;

pub use crate::config::budgets::DEFAULT_HOLD_TTL_S;

/// Longest team value kept as is in a ledger key; longer ones are keyed by a hash.
pub const MAX_TEAM_KEY: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Router,
    /// Charges only requests whose matched rule has this name.
    Rule(String),
    /// One ledger per distinct value of this (lower-cased) request header.
    Team {
        header: String,
    },
}

/// A compiled `spec.policy.budgets[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub name: String,
    pub scope: Scope,
    pub caps: Caps,
    pub window_s: u64,
}

impl Budget {
    pub fn shape(&self, hold_ttl_s: u64) -> Shape {
        Shape::new(self.window_s, hold_ttl_s)
    }
}

/// One ledger a request is charged to: a budget, and for team budgets the team.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LedgerKey {
    pub budget: usize,
    pub team: Option<String>,
}

/// The ledgers a request is under, in budget order. `rule` is the matched rule (None when the
/// default route served); `header` gives the first value of a lower-cased request header. A team
/// budget applies only when its header is present and non-empty: no header, no team, no charge.
pub fn applicable<'h>(
    budgets: &[Budget],
    rule: Option<&str>,
    header: impl Fn(&str) -> Option<&'h str>,
) -> Vec<LedgerKey> {
    let mut keys = Vec::new();
    for (i, b) in budgets.iter().enumerate() {
        let team = match &b.scope {
            Scope::Router => None,
            Scope::Rule(name) if Some(name.as_str()) == rule => None,
            Scope::Rule(_) => continue,
            Scope::Team { header: h } => match header(h) {
                Some(v) if !v.is_empty() => Some(team_key(v)),
                _ => continue,
            },
        };
        keys.push(LedgerKey { budget: i, team });
    }
    keys
}

/// A team value as it appears in ledger keys and status: itself when short and printable,
/// else `~` and a 64-bit FNV-1a hash (bounded keys; the team header is operator-controlled or,
/// with `policy.auth`, a verified claim).
pub fn team_key(value: &str) -> String {
    let printable = value
        .bytes()
        .all(|c| (0x21..0x7f).contains(&c) && c != b'~');
    if value.len() <= MAX_TEAM_KEY && printable {
        return value.to_string();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for c in value.bytes() {
        h ^= u64::from(c);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("~{h:016x}")
}

/// Where ledgers live: in memory, in proxy-wasm shared data (each update a compare-and-swap
/// loop), or behind the shared budget service. Each call is atomic on its one ledger.
pub trait LedgerStore {
    type Error;
    fn reserve(
        &mut self,
        key: &LedgerKey,
        amount: Amount,
    ) -> Result<Result<Hold, Wait>, Self::Error>;
    fn release(&mut self, key: &LedgerKey, hold: &Hold) -> Result<(), Self::Error>;
    /// Read-only: `Ok(Ok(()))` if `amount` fits now, else how long until it would.
    fn check(&mut self, key: &LedgerKey, amount: Amount) -> Result<Result<(), Wait>, Self::Error>;
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Every ledger that refused (the first one refused; the rest were asked read-only).
    pub refused: Vec<LedgerKey>,
    /// The longest wait among them: the request is admitted only when all have room.
    pub wait: Wait,
}

impl Refusal {
    /// `Retry-After` in whole seconds (at least 1). A request over a cap on its own gets the
    /// window: it will not fit later either, but a client honouring the header backs off.
    pub fn retry_after_s(&self, window_s: u64) -> u64 {
        match self.wait {
            Wait::Seconds(s) => s.max(1),
            Wait::Never => window_s.max(1),
        }
    }
}

/// What an admitted request holds, per ledger (`holds[i]` on `keys[i]`, the keys admission was
/// given: no copy of them); settle or release each exactly once.
pub type Holds = Vec<Hold>;

/// Reserves `amount` on every ledger in `keys`, or on none: when one refuses, the holds taken so
/// far are released before returning. Between the two another request may see those holds and be
/// refused too; that is conservative (it never lets anything over a cap).
pub fn admit_all<S: LedgerStore>(
    store: &mut S,
    keys: &[LedgerKey],
    amount: Amount,
) -> Result<Result<Holds, Refusal>, S::Error> {
    let mut holds: Holds = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        match store.reserve(key, amount) {
            Ok(Ok(h)) => holds.push(h),
            Ok(Err(first)) => {
                let undone = undo(store, keys, &holds);
                let mut refusal = Refusal {
                    refused: vec![key.clone()],
                    wait: first,
                };
                let asked = keys[i + 1..].iter().try_for_each(|k| {
                    if let Err(w) = store.check(k, amount)? {
                        refusal.refused.push(k.clone());
                        refusal.wait = max_wait(refusal.wait, w);
                    }
                    Ok(())
                });
                undone?;
                asked?;
                return Ok(Err(refusal));
            }
            Err(e) => {
                undo(store, keys, &holds)?;
                return Err(e);
            }
        }
    }
    Ok(Ok(holds))
}

fn undo<S: LedgerStore>(store: &mut S, keys: &[LedgerKey], holds: &[Hold]) -> Result<(), S::Error> {
    let mut result = Ok(());
    for (k, h) in keys.iter().zip(holds) {
        if let Err(e) = store.release(k, h) {
            result = Err(e);
        }
    }
    result
}

fn max_wait(a: Wait, b: Wait) -> Wait {
    match (a, b) {
        (Wait::Never, _) | (_, Wait::Never) => Wait::Never,
        (Wait::Seconds(x), Wait::Seconds(y)) => Wait::Seconds(x.max(y)),
    }
}

/// Ledgers in a map: the store of unit tests, the offline `explain`, and the model the other
/// stores are tested against.
pub struct MemoryStore<'b> {
    budgets: &'b [Budget],
    hold_ttl_s: u64,
    pub now_ms: u64,
    ledgers: std::collections::BTreeMap<LedgerKey, Ledger>,
}

impl<'b> MemoryStore<'b> {
    pub fn new(budgets: &'b [Budget], hold_ttl_s: u64) -> Self {
        MemoryStore {
            budgets,
            hold_ttl_s,
            now_ms: 0,
            ledgers: Default::default(),
        }
    }

    fn parts(&mut self, key: &LedgerKey) -> (Shape, Caps, &mut Ledger) {
        let b = &self.budgets[key.budget];
        let shape = b.shape(self.hold_ttl_s);
        let ledger = self
            .ledgers
            .entry(key.clone())
            .or_insert_with(|| Ledger::new(&shape));
        (shape, b.caps, ledger)
    }

    pub fn settle(&mut self, key: &LedgerKey, hold: Option<&Hold>, actual: Amount) {
        let now = self.now_ms;
        let (shape, _, l) = self.parts(key);
        l.settle(&shape, hold, actual, now);
    }

    /// (spent, held) on one ledger now.
    pub fn usage(&mut self, key: &LedgerKey) -> (Amount, Amount) {
        let now = self.now_ms;
        let (shape, _, l) = self.parts(key);
        (l.spent(&shape, now), l.held(&shape, now))
    }
}

impl LedgerStore for MemoryStore<'_> {
    type Error = std::convert::Infallible;

    fn reserve(
        &mut self,
        key: &LedgerKey,
        amount: Amount,
    ) -> Result<Result<Hold, Wait>, Self::Error> {
        let now = self.now_ms;
        let (shape, caps, l) = self.parts(key);
        Ok(l.try_reserve(&shape, &caps, amount, now))
    }

    fn release(&mut self, key: &LedgerKey, hold: &Hold) -> Result<(), Self::Error> {
        let now = self.now_ms;
        let (shape, _, l) = self.parts(key);
        l.release(&shape, hold, now);
        Ok(())
    }

    fn check(&mut self, key: &LedgerKey, amount: Amount) -> Result<Result<(), Wait>, Self::Error> {
        let now = self.now_ms;
        let (shape, caps, l) = self.parts(key);
        Ok(l.check(&shape, &caps, amount, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(name: &str, scope: Scope, tokens: u64) -> Budget {
        Budget {
            name: name.into(),
            scope,
            caps: Caps {
                tokens: Some(tokens),
                pico: None,
            },
            window_s: 60,
        }
    }

    fn team(h: &str) -> Scope {
        Scope::Team { header: h.into() }
    }

    #[test]
    fn scopes_pick_ledgers_per_the_spec() {
        let budgets = vec![
            budget("all", Scope::Router, 10),
            budget("chat", Scope::Rule("chat".into()), 10),
            budget("teams", team("x-llmkube-team"), 10),
            budget("teams-too", team("x-llmkube-team"), 10),
        ];
        let with_team = |v: &'static str| move |h: &str| (h == "x-llmkube-team").then_some(v);
        let keys = applicable(&budgets, Some("chat"), with_team("alpha"));
        let names: Vec<_> = keys.iter().map(|k| (k.budget, k.team.as_deref())).collect();
        assert_eq!(
            names,
            vec![(0, None), (1, None), (2, Some("alpha")), (3, Some("alpha"))]
        );
        // Another rule, no team header, or an empty one: only the router budget.
        for keys in [
            applicable(&budgets, Some("other"), |_| None),
            applicable(&budgets, None, with_team("")),
        ] {
            assert_eq!(
                keys,
                vec![LedgerKey {
                    budget: 0,
                    team: None
                }]
            );
        }
    }

    #[test]
    fn team_keys_are_bounded_and_printable() {
        assert_eq!(team_key("alpha"), "alpha");
        let long = "t".repeat(MAX_TEAM_KEY + 1);
        for odd in [long.as_str(), "a b", "~alpha", "équipe", "a\nb"] {
            let k = team_key(odd);
            assert!(k.starts_with('~') && k.len() == 17, "{odd:?} -> {k}");
        }
        assert_ne!(team_key("a b"), team_key("a  b"));
    }

    #[test]
    fn each_team_has_the_whole_cap_and_budgets_are_independent() {
        let budgets = vec![
            budget("teams", team("t"), 100),
            budget("teams-small", team("t"), 50),
        ];
        let mut store = MemoryStore::new(&budgets, DEFAULT_HOLD_TTL_S);
        let keys_of = |v: &'static str| applicable(&budgets, None, move |_| Some(v));
        let a = keys_of("a");
        let b = keys_of("b");
        let got = admit_all(&mut store, &a, Amount::new(50, 0))
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), 2);
        // Team b is untouched by team a's spending.
        assert!(admit_all(&mut store, &b, Amount::new(50, 0))
            .unwrap()
            .is_ok());
        // Team a: the small budget is full, the big one is not; the request holds nothing.
        let refused = admit_all(&mut store, &a, Amount::new(10, 0))
            .unwrap()
            .unwrap_err();
        assert_eq!(refused.refused, vec![a[1].clone()]);
        assert_eq!(store.usage(&a[0]).1.tokens, 50);
        assert_eq!(store.usage(&a[1]).1.tokens, 50);
    }

    #[test]
    fn a_refusal_releases_earlier_holds_and_reports_the_longest_wait() {
        let mut budgets = vec![
            budget("big", Scope::Router, 100),
            budget("small", Scope::Router, 10),
            budget("tiny", Scope::Router, 10),
        ];
        budgets[2].window_s = 30;
        let keys = applicable(&budgets, None, |_| None);
        let mut store = MemoryStore::new(&budgets, DEFAULT_HOLD_TTL_S);
        store.now_ms = 1_000;
        store.settle(&keys[1], None, Amount::new(10, 0));
        store.now_ms = 5_000;
        store.settle(&keys[2], None, Amount::new(10, 0));
        store.now_ms = 10_000;
        let refusal = admit_all(&mut store, &keys, Amount::new(5, 0))
            .unwrap()
            .unwrap_err();
        assert_eq!(refusal.refused, vec![keys[1].clone(), keys[2].clone()]);
        // small frees at 1 s + 60 s = 61 s, tiny at 5 s + 30 s = 35 s: the later one wins.
        assert_eq!(refusal.wait, Wait::Seconds(51));
        assert_eq!(refusal.retry_after_s(60), 51);
        assert_eq!(store.usage(&keys[0]).1, Amount::ZERO, "big holds nothing");
        let never = admit_all(&mut store, &keys, Amount::new(11, 0))
            .unwrap()
            .unwrap_err();
        assert_eq!(never.wait, Wait::Never);
        assert_eq!(never.retry_after_s(60), 60);
    }

    #[test]
    fn reserving_the_bound_never_overshoots_while_charging_after_does() {
        // 64 requests in flight at once, each using up to 10 tokens, against a cap of 100.
        let budgets = vec![budget("all", Scope::Router, 100)];
        let keys = applicable(&budgets, None, |_| None);
        let mut store = MemoryStore::new(&budgets, DEFAULT_HOLD_TTL_S);
        let holds: Vec<_> = (0..64)
            .filter_map(|_| {
                admit_all(&mut store, &keys, Amount::new(10, 0))
                    .unwrap()
                    .ok()
            })
            .collect();
        assert_eq!(holds.len(), 10);
        for h in &holds {
            store.settle(&keys[0], Some(&h[0]), Amount::new(10, 0));
        }
        assert_eq!(store.usage(&keys[0]).0.tokens, 100);
        // Checking without holding (what charge-after peers do) admits all 64.
        let mut naive = MemoryStore::new(&budgets, DEFAULT_HOLD_TTL_S);
        let admitted = (0..64)
            .filter(|_| naive.check(&keys[0], Amount::new(10, 0)).unwrap().is_ok())
            .count();
        for _ in 0..admitted {
            naive.settle(&keys[0], None, Amount::new(10, 0));
        }
        assert_eq!(naive.usage(&keys[0]).0.tokens, 640);
    }
}
