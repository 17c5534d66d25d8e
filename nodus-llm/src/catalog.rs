//! The default model catalog, shipped as data in `catalog/default.json`.

use nodus_core::catalog::Catalog;

/// The catalog file shipped with Nodus.
pub const DEFAULT_CATALOG_JSON: &str = include_str!("../catalog/default.json");

/// Why a catalog file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("model catalog: {0}")]
pub struct Error(String);

/// Read a catalog file's text; every family must have a model.
pub fn parse(text: &str) -> Result<Catalog, Error> {
    let catalog: Catalog = serde_json::from_str(text).map_err(|e| Error(e.to_string()))?;
    for family in nodus_core::catalog::Family::ALL {
        if catalog.family(family).is_none() {
            return Err(Error(format!("the family {family} has no model")));
        }
    }
    Ok(catalog)
}

/// The catalog shipped with Nodus.
pub fn default_catalog() -> Result<Catalog, Error> {
    parse(DEFAULT_CATALOG_JSON)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::Usd;
    use nodus_core::catalog::Family;

    #[test]
    fn shipped_catalog_prices_every_family() {
        let catalog = parse(DEFAULT_CATALOG_JSON).expect("the shipped catalog parses");
        for family in Family::ALL {
            let entry = catalog.family(family).expect("every family");
            assert!(entry.prices.base.output > Usd::ZERO, "{family}");
            assert!(catalog.prices_of(&entry.model).is_some());
        }
    }

    #[test]
    fn a_catalog_missing_a_family_is_refused() {
        let err = parse(r#"{"date":"2026-01-01","families":{}}"#).expect_err("no families");
        assert!(err.to_string().contains("haiku"), "{err}");
    }
}
