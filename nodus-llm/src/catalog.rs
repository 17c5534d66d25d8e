//! The model catalog as data: the shipped default (`catalog/default.json`, with the date its
//! prices are from), an operator's replacement file, and the fail-closed price lookup of
//! platform access.
//!
//! An operator replaces the catalog by pointing `NODUS_MODEL_CATALOG` at a file of the same
//! shape (or by calling [`load`]). A file is refused as a whole when it cannot be trusted: a
//! family without a model, a date that is not `YYYY-MM-DD`, or one model id with two prices.

use std::path::Path;

use nodus_core::catalog::{Catalog, Family};
use nodus_core::cost::Prices;
use nodus_core::model::{self, ErrorKind};

use crate::error::{Error, Result};

/// The catalog file shipped with Nodus.
pub const DEFAULT_CATALOG_JSON: &str = include_str!("../catalog/default.json");

/// The variable naming an operator's catalog file.
pub const CATALOG_ENV: &str = "NODUS_MODEL_CATALOG";

/// Read a catalog file's text and check it.
pub fn parse(text: &str) -> Result<Catalog> {
    let catalog: Catalog = serde_json::from_str(text).map_err(|e| Error::Catalog(e.to_string()))?;
    check(&catalog)?;
    Ok(catalog)
}

/// Check a catalog: every family has a model, the date is a date, and no model id has two
/// different prices.
pub fn check(catalog: &Catalog) -> Result<()> {
    if !is_date(&catalog.date) {
        return Err(Error::Catalog(format!(
            "the date {:?} is not YYYY-MM-DD",
            catalog.date
        )));
    }
    for family in Family::ALL {
        match catalog.family(family) {
            None => {
                return Err(Error::Catalog(format!("the family {family} has no model")));
            }
            Some(entry) if entry.model.trim().is_empty() => {
                return Err(Error::Catalog(format!(
                    "the family {family} has an empty model id"
                )));
            }
            Some(_) => {}
        }
    }
    let entries: Vec<_> = catalog
        .families
        .values()
        .chain(catalog.models.iter())
        .collect();
    for (i, a) in entries.iter().enumerate() {
        for b in &entries[i + 1..] {
            if a.model == b.model && a.prices != b.prices {
                return Err(Error::Catalog(format!(
                    "the model {} has two different prices",
                    a.model
                )));
            }
        }
    }
    Ok(())
}

fn is_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        bytes
            .get(range)
            .is_some_and(|part| part.iter().all(u8::is_ascii_digit))
    };
    let number = |range: std::ops::Range<usize>| {
        text.get(range)
            .and_then(|part| part.parse::<u32>().ok())
            .unwrap_or(0)
    };
    bytes.len() == 10
        && digits(0..4)
        && bytes[4] == b'-'
        && digits(5..7)
        && bytes[7] == b'-'
        && digits(8..10)
        && (1..=12).contains(&number(5..7))
        && (1..=31).contains(&number(8..10))
}

/// The catalog shipped with Nodus.
pub fn default_catalog() -> Result<Catalog> {
    parse(DEFAULT_CATALOG_JSON)
}

/// An operator's catalog file.
pub fn load(path: &Path) -> Result<Catalog> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Catalog(format!("cannot read {}: {e}", path.display())))?;
    parse(&text).map_err(|e| match e {
        Error::Catalog(message) => Error::Catalog(format!("{}: {message}", path.display())),
        other => other,
    })
}

/// The operator's catalog when `NODUS_MODEL_CATALOG` names one, else the shipped default.
pub fn from_env() -> Result<Catalog> {
    from_lookup(|name| std::env::var(name).ok())
}

/// As [`from_env`], from any source of variables.
pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Catalog> {
    match lookup(CATALOG_ENV).filter(|path| !path.trim().is_empty()) {
        Some(path) => load(Path::new(path.trim())),
        None => default_catalog(),
    }
}

/// The prices of a platform call to `model`, or a final error when the catalog has none:
/// platform access fails closed rather than make a call it cannot bill.
pub fn platform_prices<'a>(catalog: &'a Catalog, model: &str) -> Result<&'a Prices, model::Error> {
    catalog.prices_of(model).ok_or_else(|| model::Error {
        kind: ErrorKind::Final,
        message: format!("the model {model} has no known price; platform access refuses it"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::Usd;

    #[test]
    fn shipped_catalog_prices_every_family_and_is_dated() {
        let catalog = parse(DEFAULT_CATALOG_JSON).expect("the shipped catalog parses");
        assert_eq!(catalog.date, "2025-11-24");
        assert!(!catalog.notes.is_empty());
        for family in Family::ALL {
            let entry = catalog.family(family).expect("every family");
            assert!(entry.prices.base.output > Usd::ZERO, "{family}");
            assert!(catalog.prices_of(&entry.model).is_some());
        }
        // The families grow (or stay) in price from haiku to fable.
        let output = |family| catalog.family(family).map(|e| e.prices.base.output);
        assert!(output(Family::Haiku) < output(Family::Sonnet));
        assert!(output(Family::Sonnet) < output(Family::Opus));
        assert!(output(Family::Opus) <= output(Family::Fable));
    }

    #[test]
    fn catalogs_that_cannot_be_trusted_are_refused() {
        let err = parse(r#"{"date":"2026-01-01","families":{}}"#).expect_err("no families");
        assert!(err.to_string().contains("haiku"), "{err}");
        let mut text = DEFAULT_CATALOG_JSON.replace("2025-11-24", "last week");
        assert!(
            parse(&text)
                .expect_err("bad date")
                .to_string()
                .contains("YYYY-MM-DD")
        );
        text = DEFAULT_CATALOG_JSON.replace(
            r#""model": "claude-3-haiku-20240307""#,
            r#""model": "claude-haiku-4-5""#,
        );
        assert!(
            parse(&text)
                .expect_err("two prices")
                .to_string()
                .contains("two different prices")
        );
        let unknown = DEFAULT_CATALOG_JSON.replace(r#""date""#, r#""extra": 1, "date""#);
        assert!(parse(&unknown).is_err());
    }

    #[test]
    fn an_operator_file_replaces_the_default() {
        let dir = std::env::temp_dir().join(format!("nodus-catalog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("catalog.json");
        let text = DEFAULT_CATALOG_JSON.replace(
            r#""model": "claude-haiku-4-5""#,
            r#""model": "local-small""#,
        );
        std::fs::write(&path, text).expect("write");
        let path_text = path.display().to_string();
        let catalog = from_lookup(|name| (name == CATALOG_ENV).then(|| path_text.clone()))
            .expect("the operator's file");
        assert_eq!(
            catalog.family(Family::Haiku).map(|e| e.model.as_str()),
            Some("local-small")
        );
        assert_eq!(
            from_lookup(|_| None).expect("default"),
            default_catalog().expect("default")
        );
        let missing = from_lookup(|_| Some("/nonexistent/catalog.json".into()));
        assert!(
            missing
                .expect_err("missing file")
                .to_string()
                .contains("/nonexistent")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn platform_access_fails_closed_on_unknown_models() {
        let catalog = default_catalog().expect("default");
        assert!(platform_prices(&catalog, "claude-sonnet-4-5").is_ok());
        let err = platform_prices(&catalog, "gpt-unknown").expect_err("no price");
        assert_eq!(err.kind, ErrorKind::Final);
        assert!(err.message.contains("no known price"));
    }
}
