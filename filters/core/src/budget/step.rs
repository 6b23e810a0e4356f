//! The budget step of a request, from its facts to what to reserve and, at the end, to charge.

use super::admit::{applicable, LedgerKey};
use super::bound::{upper_bound, Bound, RequestFacts};
use super::compiled::CompiledBudgets;
use super::money::Price;
use super::usage::Charge;
use super::window::Amount;

/// What an admitted request reserves, and on which ledgers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetPlan {
    pub keys: Vec<LedgerKey>,
    pub bound: Bound,
    pub amount: Amount,
}

/// One backend the request may be sent to: its price and `modelInfo.contextLength`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub price: Price,
    pub context_length: Option<u64>,
}

/// `None` when no budget applies (nothing to reserve). With fallbacks the bound must hold for
/// whichever backend serves: the dearest price, and the largest context (none if any backend
/// declares none). `attempts` is walked twice (an iterator, so the caller needs no list).
pub fn plan<'h, A: IntoIterator<Item = Attempt> + Clone>(
    c: &CompiledBudgets,
    rule: Option<&str>,
    header: impl Fn(&str) -> Option<&'h str>,
    facts: &RequestFacts,
    attempts: A,
) -> Option<BudgetPlan> {
    let keys = applicable(&c.budgets, rule, header);
    if keys.is_empty() {
        return None;
    }
    let price = attempts
        .clone()
        .into_iter()
        .fold(Price::default(), |p, a| p.max(a.price));
    let context = attempts
        .into_iter()
        .map(|a| a.context_length)
        .try_fold(0u64, |m, c| c.map(|c| m.max(c)))
        .filter(|&m| m > 0);
    let bound = upper_bound(facts, context, c.default_max_tokens);
    Some(BudgetPlan {
        keys,
        amount: bound.amount(&price),
        bound,
    })
}

/// What a settled request is charged, at the prices of the backend that served it.
pub fn charged(price: &Price, charge: &Charge) -> Amount {
    Amount::new(
        charge.tokens(),
        price.cost(charge.prompt, charge.completion),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::compiled::BudgetsConfig;

    fn compiled() -> CompiledBudgets {
        serde_json::from_str::<BudgetsConfig>(
            r#"{"budgets":[{"name":"teams","scope":"team","max_usd":"1","window_s":60}]}"#,
        )
        .unwrap()
        .compile()
        .unwrap()
    }

    #[test]
    fn plans_on_the_dearest_backend_and_the_largest_context() {
        let c = compiled();
        let facts = RequestFacts {
            body_bytes: 328,
            max_output: None,
            choices: 1,
            ..Default::default()
        };
        let cheap = Attempt {
            price: Price {
                prompt: 1,
                completion: 2,
            },
            context_length: Some(2000),
        };
        let dear = Attempt {
            price: Price {
                prompt: 10,
                completion: 30,
            },
            context_length: Some(8000),
        };
        let p = plan(&c, None, |_| Some("alpha"), &facts, [cheap, dear]).unwrap();
        assert_eq!(p.keys[0].team.as_deref(), Some("alpha"));
        assert_eq!(p.bound.total, Some(8000));
        // Completion is dearer: all 8000 tokens as completion.
        assert_eq!(p.amount, Amount::new(8000, 8000 * 30));
        // A backend without a context length: the gateway must cap max_tokens itself.
        let open = Attempt {
            context_length: None,
            ..cheap
        };
        let p = plan(&c, None, |_| Some("alpha"), &facts, [dear, open]).unwrap();
        assert_eq!(p.bound.set_max_tokens, Some(4096));
        assert_eq!(p.amount.tokens, 1000 + 4096);
        // No team header: no budget, nothing to reserve.
        assert_eq!(plan(&c, None, |_| None, &facts, [cheap]), None);
    }

    #[test]
    fn charges_at_the_serving_backends_price() {
        let price = Price {
            prompt: 150_000,
            completion: 600_000,
        };
        let charge = Charge {
            prompt: 10,
            completion: 5,
            estimated: false,
        };
        assert_eq!(
            charged(&price, &charge),
            Amount::new(15, 10 * 150_000 + 5 * 600_000)
        );
    }
}
