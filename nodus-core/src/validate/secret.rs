//! The rules of a Secret, read from its own document shape; a value never appears in an
//! error.

use serde_json::Value;

use super::display::{deserialize_error, push_key, shown_json};
use super::{Invalid, Result, check_common_metadata, require_name, shown};
use crate::resource::{API_VERSION, ObjectMeta, Secret};

/// The longest key of a Secret's values.
pub const MAX_SECRET_KEY_CHARS: usize = 253;

/// Reads a user's Secret (`apiVersion`, `kind`, `metadata`, `type`, `stringData`) and checks
/// it. A value never appears in an error.
pub(crate) fn parse_secret(document: Value) -> Result<Secret> {
    let Value::Object(mut fields) = document else {
        return Err(Invalid::new(
            "",
            "a Secret is a JSON object",
            shown_json(Some(&document)),
        ));
    };
    const FIELDS: [&str; 5] = ["apiVersion", "kind", "metadata", "stringData", "type"];
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        let rule = if unknown == "data" {
            "unknown field (write values as stringData)"
        } else {
            "unknown field"
        };
        return Err(Invalid::new(unknown.clone(), rule, shown(unknown)));
    }
    let api_version = fields.remove("apiVersion");
    if api_version.as_ref().and_then(Value::as_str) != Some(API_VERSION) {
        return Err(Invalid::new(
            "apiVersion",
            format!("must be {API_VERSION}"),
            shown_json(api_version.as_ref()),
        ));
    }
    let kind = fields.remove("kind");
    if kind.as_ref().and_then(Value::as_str) != Some("Secret") {
        return Err(Invalid::new(
            "kind",
            "must be Secret",
            shown_json(kind.as_ref()),
        ));
    }
    let metadata = fields.remove("metadata").unwrap_or(Value::Null);
    let metadata: ObjectMeta = if metadata.is_null() {
        ObjectMeta::default()
    } else {
        let wrapped = serde_json::json!({ "metadata": metadata });
        #[derive(serde::Deserialize)]
        struct Wrapped {
            metadata: ObjectMeta,
        }
        serde_path_to_error::deserialize::<_, Wrapped>(&wrapped)
            .map_err(|error| deserialize_error(&wrapped, &error))?
            .metadata
    };
    let secret_type = match fields.remove("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text),
        Some(other) => {
            return Err(Invalid::new(
                "type",
                "is a string",
                shown_json(Some(&other)),
            ));
        }
    };
    let values = match fields.remove("stringData") {
        None | Some(Value::Null) => std::collections::BTreeMap::new(),
        Some(Value::Object(map)) => {
            let mut values = std::collections::BTreeMap::new();
            for (key, value) in map {
                let Value::String(value) = value else {
                    let mut field = String::from("stringData");
                    push_key(&mut field, &key);
                    return Err(Invalid::new(field, "is a string", "another type"));
                };
                values.insert(key, crate::secret::SecretString::new(value));
            }
            values
        }
        Some(_) => {
            return Err(Invalid::new(
                "stringData",
                "is a map of string keys to string values",
                "another shape",
            ));
        }
    };
    let secret = Secret {
        metadata,
        secret_type,
        keys: values.keys().cloned().collect(),
        values,
        sealed: None,
    };
    check_secret(&secret)?;
    Ok(secret)
}

/// Checks a Secret: its metadata (a name is required) and its keys (1 to
/// [`MAX_SECRET_KEY_CHARS`] characters).
pub(crate) fn check_secret(secret: &Secret) -> Result<()> {
    check_common_metadata(&secret.metadata)?;
    require_name(&secret.metadata)?;
    if let Some(key) = secret
        .values
        .keys()
        .find(|k| k.is_empty() || k.chars().count() > MAX_SECRET_KEY_CHARS)
    {
        return Err(Invalid::new(
            "stringData",
            format!("keys are 1 to {MAX_SECRET_KEY_CHARS} characters"),
            shown(key),
        ));
    }
    Ok(())
}
