//! Project credits and budgets: before a model or routing call on platform access a run
//! reserves the call's worst case against its project's credits (and the project's Budget);
//! afterwards the reservation settles to the real cost. A run whose project cannot cover the
//! call waits (`AwaitingFunds`) and continues when credits are added.
//!
//! [`Account`] is the pure bookkeeping; [`StoreLedger`] keeps one account per project in the
//! store, written with optimistic concurrency; [`Unmetered`] is for embedders who bill
//! elsewhere.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::money::Usd;
use crate::resource::Kind;
use crate::store::{self, ObjectKey, Selector, Store};

/// The project that holds what Nodus keeps for itself (the projects' accounts; the server
/// keeps its tokens there too). It is not a DNS label, so no user project can have its name.
pub const SYSTEM_PROJECT: &str = "_system";

/// A project's credits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Account {
    /// Credits left (reservations not yet taken off).
    #[serde(rename = "balanceUSD")]
    pub balance_usd: Usd,
    /// Everything spent so far.
    #[serde(rename = "spentUSD")]
    pub spent_usd: Usd,
    /// Reservations of calls under way, by key (`<run uid>/<step>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reserved: BTreeMap<String, Usd>,
}

/// A call the account cannot cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Not enough credits.
    #[error("the project's credits ({available} available) do not cover {needed}")]
    Credits {
        /// Available credits.
        available: Usd,
        /// The call's worst case.
        needed: Usd,
    },
    /// The project's Budget would be exceeded.
    #[error("the project's budget of {budget} would be exceeded")]
    Budget {
        /// The budget.
        budget: Usd,
    },
}

impl Account {
    /// Everything reserved.
    pub fn reserved_total(&self) -> Usd {
        self.reserved.values().copied().sum()
    }

    /// Credits not reserved.
    pub fn available(&self) -> Usd {
        self.balance_usd.saturating_sub(self.reserved_total())
    }

    /// Reserve `amount` under `key`; repeating a key changes nothing.
    pub fn reserve(&mut self, key: &str, amount: Usd, budget: Option<Usd>) -> Result<(), Refusal> {
        if self.reserved.contains_key(key) {
            return Ok(());
        }
        if amount > self.available() {
            return Err(Refusal::Credits {
                available: self.available(),
                needed: amount,
            });
        }
        if let Some(budget) = budget
            && self
                .spent_usd
                .saturating_add(self.reserved_total())
                .saturating_add(amount)
                > budget
        {
            return Err(Refusal::Budget { budget });
        }
        self.reserved.insert(key.to_string(), amount);
        Ok(())
    }

    /// Settle the reservation under `key` to `actual`; settling twice changes nothing.
    pub fn settle(&mut self, key: &str, actual: Usd) {
        if self.reserved.remove(key).is_none() {
            return;
        }
        self.balance_usd = self.balance_usd.saturating_sub(actual);
        self.spent_usd = self.spent_usd.saturating_add(actual);
    }
}

/// Where reservations go.
#[async_trait]
pub trait Ledger: Send + Sync {
    /// Reserve `amount` for `key` in `project`; `Ok(false)` when the project cannot cover it.
    async fn reserve(&self, project: &str, key: &str, amount: Usd) -> Result<bool, store::Error>;
    /// Settle the reservation for `key` to what the call cost.
    async fn settle(&self, project: &str, key: &str, actual: Usd) -> Result<(), store::Error>;
}

/// No credits: every call is covered (for embedders who bill elsewhere).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unmetered;

#[async_trait]
impl Ledger for Unmetered {
    async fn reserve(&self, _: &str, _: &str, _: Usd) -> Result<bool, store::Error> {
        Ok(true)
    }
    async fn settle(&self, _: &str, _: &str, _: Usd) -> Result<(), store::Error> {
        Ok(())
    }
}

/// Where the account of `project` is kept: an [`Kind::Account`] document of
/// [`SYSTEM_PROJECT`] named after the project. A project exists for Nodus when it has one.
pub fn account_key(project: &str) -> ObjectKey {
    ObjectKey::new(SYSTEM_PROJECT, Kind::Account, project)
}

/// The projects with an account, in the order their accounts were made.
pub async fn projects(store: &dyn Store) -> Result<Vec<String>, store::Error> {
    Ok(store
        .list(SYSTEM_PROJECT, Kind::Account, &Selector::default())
        .await?
        .into_iter()
        .map(|record| record.key.name)
        .collect())
}

/// One account per project, kept in the store at [`account_key`]; the project's Budget
/// resources cap its total spend.
#[derive(Clone)]
pub struct StoreLedger {
    store: Arc<dyn Store>,
}

impl StoreLedger {
    /// Accounts in this store.
    pub fn new(store: Arc<dyn Store>) -> Self {
        StoreLedger { store }
    }

    /// Make the project's account if it has none, with `credits`.
    pub async fn open(&self, project: &str, credits: Usd) -> Result<Account, store::Error> {
        match self.read(project).await {
            Ok((account, _)) => Ok(account),
            Err(store::Error::NotFound(_)) => {
                let account = Account {
                    balance_usd: credits,
                    ..Account::default()
                };
                match self
                    .store
                    .create(&account_key(project), document(project, &account))
                    .await
                {
                    Ok(_) => Ok(account),
                    Err(store::Error::AlreadyExists(_)) => Ok(self.read(project).await?.0),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn read(&self, project: &str) -> Result<(Account, u64), store::Error> {
        let record = self.store.get(&account_key(project)).await?;
        let account = account_of(&record.document)
            .map_err(|e| store::Error::Corrupt(format!("account of project {project}: {e}")))?;
        Ok((account, record.version))
    }

    /// The project's account (a project without one has no credits).
    pub async fn account(&self, project: &str) -> Result<Account, store::Error> {
        match self.read(project).await {
            Ok((account, _)) => Ok(account),
            Err(store::Error::NotFound(_)) => Ok(Account::default()),
            Err(e) => Err(e),
        }
    }

    /// Add credits; runs waiting for funds see the change.
    pub async fn add(&self, project: &str, amount: Usd) -> Result<Account, store::Error> {
        self.open(project, Usd::ZERO).await?;
        self.update(project, move |account| {
            account.balance_usd = account.balance_usd.saturating_add(amount);
            Ok(())
        })
        .await
    }

    /// The smallest `spec.maxSpendUSD` of the project's Budgets.
    async fn budget(&self, project: &str) -> Result<Option<Usd>, store::Error> {
        let budgets = self
            .store
            .list(project, Kind::Budget, &Selector::default())
            .await?;
        Ok(budgets
            .iter()
            .filter_map(|b| {
                b.document["spec"]["maxSpendUSD"]
                    .as_str()?
                    .parse::<Usd>()
                    .ok()
            })
            .min())
    }

    /// Apply `change` to the project's account atomically (one store edit; nothing is
    /// written when it refuses); the account afterwards.
    async fn update(
        &self,
        project: &str,
        mut change: impl FnMut(&mut Account) -> Result<(), Refusal> + Send + 'static,
    ) -> Result<Account, store::Error> {
        let owner = project.to_string();
        let edit: store::Edit = Box::new(move |stored| {
            let mut account = account_of(stored).ok()?;
            change(&mut account).ok()?;
            Some(document(&owner, &account))
        });
        let record = self.store.modify(&account_key(project), edit).await?;
        account_of(&record.document)
            .map_err(|e| store::Error::Corrupt(format!("account of project {project}: {e}")))
    }
}

fn account_of(document: &serde_json::Value) -> Result<Account, serde_json::Error> {
    Account::deserialize(&document["status"]["account"])
}

fn document(project: &str, account: &Account) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": crate::resource::API_VERSION,
        "kind": "Account",
        "metadata": {"name": project},
        "status": {"account": account},
    })
}

#[async_trait]
impl Ledger for StoreLedger {
    async fn reserve(&self, project: &str, key: &str, amount: Usd) -> Result<bool, store::Error> {
        let budget = self.budget(project).await?;
        let reservation = key.to_string();
        match self
            .update(project, move |account| {
                account.reserve(&reservation, amount, budget)
            })
            .await
        {
            Ok(account) => Ok(account.reserved.contains_key(key)),
            Err(store::Error::NotFound(_)) => Ok(amount.is_zero()),
            Err(e) => Err(e),
        }
    }

    async fn settle(&self, project: &str, key: &str, actual: Usd) -> Result<(), store::Error> {
        // A reservation already settled (or never made) writes nothing: the executor settles
        // again after a restart, in case a crash came between a step's outcome and its settle.
        let settled = key.to_string();
        let owner = project.to_string();
        let edit: store::Edit = Box::new(move |stored| {
            let mut account = account_of(stored).ok()?;
            account.reserved.contains_key(&settled).then(|| {
                account.settle(&settled, actual);
                document(&owner, &account)
            })
        });
        match self.store.modify(&account_key(project), edit).await {
            Ok(_) | Err(store::Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_cover_calls_and_settle_exactly() {
        let mut account = Account {
            balance_usd: Usd::from_cents(100),
            ..Account::default()
        };
        account
            .reserve("r/1", Usd::from_cents(60), None)
            .expect("fits");
        account
            .reserve("r/1", Usd::from_cents(60), None)
            .expect("a repeat is a no-op");
        assert_eq!(account.available(), Usd::from_cents(40));
        let refused = account
            .reserve("r/2", Usd::from_cents(50), None)
            .expect_err("no room");
        assert_eq!(
            refused,
            Refusal::Credits {
                available: Usd::from_cents(40),
                needed: Usd::from_cents(50)
            }
        );
        account.settle("r/1", Usd::from_cents(7));
        account.settle("r/1", Usd::from_cents(7));
        assert_eq!(account.balance_usd, Usd::from_cents(93));
        assert_eq!(account.spent_usd, Usd::from_cents(7));
        let over_budget = account.reserve("r/3", Usd::from_cents(10), Some(Usd::from_cents(10)));
        assert_eq!(
            over_budget,
            Err(Refusal::Budget {
                budget: Usd::from_cents(10)
            })
        );
        account
            .reserve("r/3", Usd::from_cents(3), Some(Usd::from_cents(10)))
            .expect("within budget");
    }
}
