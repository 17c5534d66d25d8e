//! `Budget`: a cap on a project's total spend, which the ledger reads before every reservation.

use serde::{Deserialize, Serialize};

use crate::money::Usd;

/// `spec` of a Budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// The most the project may spend in all.
    #[serde(rename = "maxSpendUSD")]
    pub max_spend_usd: Usd,
}

/// A Budget has no status of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct BudgetStatus {}
