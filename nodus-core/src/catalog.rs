//! The model catalog as data: model families, their model ids and their prices.
//!
//! nodus-core only defines the shape; nodus-llm ships the default catalog file.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cost::Prices;

/// A model family the router chooses between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// The smallest and cheapest.
    Haiku,
    /// The default, and the fallback when routing fails.
    Sonnet,
    /// For demanding work.
    Opus,
    /// For the most demanding work.
    Fable,
}

impl Family {
    /// Every family, smallest first.
    pub const ALL: [Family; 4] = [Family::Haiku, Family::Sonnet, Family::Opus, Family::Fable];
    /// The family that answers when the router fails or times out.
    pub const FALLBACK: Family = Family::Sonnet;

    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Haiku => "haiku",
            Family::Sonnet => "sonnet",
            Family::Opus => "opus",
            Family::Fable => "fable",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One model with its prices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogModel {
    /// The provider's model id.
    pub model: String,
    /// Provider prices per million tokens.
    pub prices: Prices,
}

/// Families and models with their prices, as of `date`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Catalog {
    /// When the prices were taken from the provider's published list (YYYY-MM-DD).
    pub date: String,
    /// What an operator should know about the file: where the prices come from, how the
    /// families were mapped to models.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The model that answers for each family.
    pub families: BTreeMap<Family, CatalogModel>,
    /// Further priced models (for BYOK agents that name one, and for routers).
    #[serde(default)]
    pub models: Vec<CatalogModel>,
}

impl Catalog {
    /// The model that answers for `family`.
    pub fn family(&self, family: Family) -> Option<&CatalogModel> {
        self.families.get(&family)
    }

    /// The prices of a model id, from the families or the further models.
    pub fn prices_of(&self, model: &str) -> Option<&Prices> {
        self.families
            .values()
            .chain(self.models.iter())
            .find(|entry| entry.model == model)
            .map(|entry| &entry.prices)
    }
}
