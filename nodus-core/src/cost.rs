//! Exact cost: billing a call's usage, the worst case of a call, and the per-call cost guard.
//!
//! A call costs the provider price of its usage divided by 0.875, rounded up to the
//! nano-dollar. Before a call the guard reserves its worst case; the call is made only
//! if that fits under what is left of the cap, and afterwards the reservation settles
//! to the real cost.

use serde::{Deserialize, Serialize};

use crate::money::Usd;

/// Tokens a model call used, as the provider reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Input tokens read from the prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
}

impl Usage {
    /// Every input-side token: uncached, cache writes and cache reads.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_write_tokens)
            .saturating_add(self.cache_read_tokens)
    }

    /// The sum of two usages.
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cache_write_tokens: self
                .cache_write_tokens
                .saturating_add(other.cache_write_tokens),
            cache_read_tokens: self
                .cache_read_tokens
                .saturating_add(other.cache_read_tokens),
        }
    }
}

/// Provider prices of one band, each per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rates {
    /// Uncached input.
    pub input: Usd,
    /// Output.
    pub output: Usd,
    /// Cache writes.
    pub cache_write: Usd,
    /// Cache reads.
    pub cache_read: Usd,
}

impl Rates {
    /// The highest rate an input-side token can be charged at.
    fn highest_input(&self) -> Usd {
        self.input.max(self.cache_write).max(self.cache_read)
    }
}

/// A band of higher prices that applies when a call's prompt is longer than a threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LongPromptBand {
    /// The band applies to a whole call whose prompt tokens exceed this.
    pub above_prompt_tokens: u64,
    /// The band's rates.
    pub rates: Rates,
}

/// A model's provider prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Prices {
    /// The standard rates.
    #[serde(flatten)]
    pub base: Rates,
    /// Higher rates past a prompt length, where the provider charges them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_prompt: Option<LongPromptBand>,
}

impl Prices {
    /// The rates that apply to a call with this many prompt tokens.
    fn rates_for(&self, prompt_tokens: u64) -> &Rates {
        match &self.long_prompt {
            Some(band) if prompt_tokens > band.above_prompt_tokens => &band.rates,
            _ => &self.base,
        }
    }

    /// The highest rates that can apply to a call of up to `prompt_tokens`.
    fn highest_rates(&self, prompt_tokens: u64) -> (Usd, Usd) {
        let base = (self.base.highest_input(), self.base.output);
        match &self.long_prompt {
            Some(band) if prompt_tokens > band.above_prompt_tokens => (
                base.0.max(band.rates.highest_input()),
                base.1.max(band.rates.output),
            ),
            _ => base,
        }
    }
}

/// The platform's margin: the provider price is divided by 0.875 (multiplied by 8/7).
const MARGIN_NUMERATOR: u128 = 8;
const MARGIN_DENOMINATOR: u128 = 7;
const TOKENS_PER_PRICE_UNIT: u128 = 1_000_000;

/// `Σ tokens × price-per-million / 0.875`, rounded up to the nano-dollar.
fn charge(parts: &[(u64, Usd)]) -> Usd {
    // nano-dollars × tokens, before dividing by one million tokens.
    let provider: u128 = parts
        .iter()
        .map(|&(tokens, rate)| u128::from(tokens) * u128::from(rate.nanos()))
        .sum();
    let numerator = provider * MARGIN_NUMERATOR;
    let denominator = TOKENS_PER_PRICE_UNIT * MARGIN_DENOMINATOR;
    let nanos = numerator.div_ceil(denominator);
    Usd::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// What a call with this usage costs on the platform.
pub fn bill(prices: &Prices, usage: &Usage) -> Usd {
    let rates = prices.rates_for(usage.prompt_tokens());
    charge(&[
        (usage.input_tokens, rates.input),
        (usage.output_tokens, rates.output),
        (usage.cache_write_tokens, rates.cache_write),
        (usage.cache_read_tokens, rates.cache_read),
    ])
}

/// The most a call can cost: `prompt_tokens` (an upper bound of the conversation) at the
/// highest input rate that can apply, plus `max_tokens` of output at the highest output rate.
pub fn worst_case(prices: &Prices, prompt_tokens: u64, max_tokens: u32) -> Usd {
    let (input, output) = prices.highest_rates(prompt_tokens);
    charge(&[(prompt_tokens, input), (u64::from(max_tokens), output)])
}

/// A reservation the guard made; settled exactly once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation must be settled"]
pub struct Reservation {
    amount: Usd,
}

impl Reservation {
    /// The amount reserved.
    pub fn amount(&self) -> Usd {
        self.amount
    }
}

/// Refusal: the call at its largest does not fit under what is left of the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the call may cost up to {needed} but only {left} is left under the cap of {cap}")]
pub struct MaxCostReached {
    /// The call's worst case.
    pub needed: Usd,
    /// What is left under the cap.
    pub left: Usd,
    /// The cap.
    pub cap: Usd,
}

/// The per-call cost guard of one run: reserve at the largest, settle to the real cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostGuard {
    cap: Option<Usd>,
    spent: Usd,
    reserved: Usd,
}

impl CostGuard {
    /// A guard for a run with this cap (`None`: not charged, as on the user's own key)
    /// that has already spent `spent`.
    pub fn new(cap: Option<Usd>, spent: Usd) -> Self {
        CostGuard {
            cap,
            spent,
            reserved: Usd::ZERO,
        }
    }

    /// What has been spent.
    pub fn spent(&self) -> Usd {
        self.spent
    }

    /// What is reserved for calls under way.
    pub fn reserved(&self) -> Usd {
        self.reserved
    }

    /// What is left under the cap (`None` when there is no cap).
    pub fn left(&self) -> Option<Usd> {
        self.cap
            .map(|cap| cap.saturating_sub(self.spent).saturating_sub(self.reserved))
    }

    /// Reserve a call at its worst case, or refuse when it does not fit.
    pub fn reserve(&mut self, worst_case: Usd) -> Result<Reservation, MaxCostReached> {
        if let (Some(cap), Some(left)) = (self.cap, self.left())
            && worst_case > left
        {
            return Err(MaxCostReached {
                needed: worst_case,
                left,
                cap,
            });
        }
        self.reserved = self.reserved.saturating_add(worst_case);
        Ok(Reservation { amount: worst_case })
    }

    /// Settle a reservation to what the call really cost. Spending is recorded as it was
    /// even if it exceeds the reservation (a worst case that was wrong is a bug to report,
    /// never money to hide); the return says whether the reservation held.
    pub fn settle(&mut self, reservation: Reservation, actual: Usd) -> bool {
        self.reserved = self.reserved.saturating_sub(reservation.amount);
        self.spent = self.spent.saturating_add(actual);
        actual <= reservation.amount
    }

    /// Release a reservation whose call was not made.
    pub fn release(&mut self, reservation: Reservation) {
        self.reserved = self.reserved.saturating_sub(reservation.amount);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn usd(text: &str) -> Usd {
        text.parse().expect("test amount")
    }

    fn sonnet() -> Prices {
        Prices {
            base: Rates {
                input: usd("3"),
                output: usd("15"),
                cache_write: usd("3.75"),
                cache_read: usd("0.30"),
            },
            long_prompt: Some(LongPromptBand {
                above_prompt_tokens: 200_000,
                rates: Rates {
                    input: usd("6"),
                    output: usd("22.50"),
                    cache_write: usd("7.50"),
                    cache_read: usd("0.60"),
                },
            }),
        }
    }

    #[test]
    fn bill_divides_by_0_875_and_rounds_up() {
        // 1000 input at $3/M = $0.003; 100 output at $15/M = $0.0015; total $0.0045 / 0.875
        // = $0.005142857142… → 5_142_858 nanos.
        let usage = Usage {
            input_tokens: 1000,
            output_tokens: 100,
            ..Usage::default()
        };
        assert_eq!(bill(&sonnet(), &usage), Usd::from_nanos(5_142_858));
        // Exactly divisible: 875 input tokens at $3/M = $0.002625 = 2_625_000 nanos, / 0.875
        // = 3_000_000 nanos, with nothing to round.
        let usage = Usage {
            input_tokens: 875,
            ..Usage::default()
        };
        assert_eq!(bill(&sonnet(), &usage), Usd::from_nanos(3_000_000));
    }

    #[test]
    fn cached_tokens_use_their_own_rates_and_long_prompts_their_band() {
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 0,
            cache_write_tokens: 1_000_000,
            cache_read_tokens: 0,
        };
        // The prompt is over 200k tokens: the band applies to the whole call.
        let provider = 10 * 6_000 + 7_500_000_000u64; // nanos × tokens / 1M already reduced
        let expected = (u128::from(provider) * 8).div_ceil(7);
        assert_eq!(bill(&sonnet(), &usage).nanos() as u128, expected);
    }

    #[test]
    fn guard_refuses_a_call_that_does_not_fit_and_settles_exactly() {
        let mut guard = CostGuard::new(Some(usd("0.10")), Usd::ZERO);
        let reservation = guard.reserve(usd("0.06")).expect("fits");
        assert_eq!(guard.left(), Some(usd("0.04")));
        let refused = guard.reserve(usd("0.05")).expect_err("does not fit");
        assert_eq!(refused.left, usd("0.04"));
        assert!(guard.settle(reservation, usd("0.01")));
        assert_eq!(guard.spent(), usd("0.01"));
        assert_eq!(guard.left(), Some(usd("0.09")));
        let uncapped = CostGuard::new(None, Usd::ZERO).reserve(Usd::MAX);
        assert!(uncapped.is_ok());
    }

    fn rates() -> impl Strategy<Value = Rates> {
        (
            0u64..100_000_000_000,
            0u64..100_000_000_000,
            0u64..100_000_000_000,
            0u64..100_000_000_000,
        )
            .prop_map(|(i, o, w, r)| Rates {
                input: Usd::from_nanos(i),
                output: Usd::from_nanos(o),
                cache_write: Usd::from_nanos(w),
                cache_read: Usd::from_nanos(r),
            })
    }

    fn prices() -> impl Strategy<Value = Prices> {
        (rates(), proptest::option::of((1u64..1_000_000, rates()))).prop_map(|(base, band)| {
            Prices {
                base,
                long_prompt: band.map(|(above_prompt_tokens, rates)| LongPromptBand {
                    above_prompt_tokens,
                    rates,
                }),
            }
        })
    }

    fn usage() -> impl Strategy<Value = Usage> {
        (
            0u64..2_000_000,
            0u64..100_000,
            0u64..2_000_000,
            0u64..2_000_000,
        )
            .prop_map(
                |(input_tokens, output_tokens, cache_write_tokens, cache_read_tokens)| Usage {
                    input_tokens,
                    output_tokens,
                    cache_write_tokens,
                    cache_read_tokens,
                },
            )
    }

    proptest! {
        #[test]
        fn worst_case_is_never_below_the_real_cost(prices in prices(), usage in usage()) {
            let max_tokens = u32::try_from(usage.output_tokens).expect("small");
            let worst = worst_case(&prices, usage.prompt_tokens(), max_tokens);
            prop_assert!(bill(&prices, &usage) <= worst);
        }

        #[test]
        fn spend_under_the_guard_never_exceeds_the_cap(
            cap in 0u64..1_000_000_000,
            calls in proptest::collection::vec((0u64..400_000_000, 0u64..=100), 0..40),
        ) {
            let mut guard = CostGuard::new(Some(Usd::from_nanos(cap)), Usd::ZERO);
            for (worst, percent_used) in calls {
                let worst = Usd::from_nanos(worst);
                match guard.reserve(worst) {
                    Ok(reservation) => {
                        let actual = Usd::from_nanos(worst.nanos() / 100 * percent_used);
                        prop_assert!(guard.settle(reservation, actual));
                    }
                    Err(refused) => prop_assert!(refused.needed > refused.left),
                }
                prop_assert!(guard.spent() <= Usd::from_nanos(cap));
            }
        }
    }
}
