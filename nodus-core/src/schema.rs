//! JSON Schemas (schemars) of the types whose JSON is written by hand rather than derived:
//! exact dollar amounts, durations, timestamps, a name-or-inline reference, run and group
//! phases, and a Secret as it is written and as it reads. With the `openapi` feature, for the
//! server's OpenAPI document.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use crate::group::GroupPhase;
use crate::lifecycle::RunPhase;
use crate::money::Usd;
pub use crate::resource::DateTime;
use crate::resource::{DurationSpec, NameOrInline, ObjectMeta, SecretDocument};

impl JsonSchema for Usd {
    fn schema_name() -> Cow<'static, str> {
        "USD".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^[0-9]+(\\.[0-9]{1,9})?$",
            "description": "An exact amount of US dollars as a decimal string (\"5.00\"), at most 9 decimals",
        })
    }
}

impl JsonSchema for DurationSpec {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A duration: whole hours, minutes and seconds (\"90s\", \"10m\", \"1h30m\") or seconds; read back as text",
            "anyOf": [
                {"type": "string", "pattern": "^([0-9]+|([0-9]+h)?([0-9]+m)?([0-9]+s)?)$"},
                {"type": "integer", "minimum": 0},
            ],
        })
    }
}

impl<T: JsonSchema> JsonSchema for NameOrInline<T> {
    fn schema_name() -> Cow<'static, str> {
        format!("NameOr{}", T::schema_name()).into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let inline = generator.subschema_for::<T>();
        json_schema!({
            "description": "A stored object's `name` or `project/name`, or the whole spec written inline",
            "anyOf": [{"type": "string"}, inline],
        })
    }
}

/// `phase` and `reason`, as a run's and a group's status write them.
fn phase_schema(phases: Vec<&'static str>, reasons: Vec<&'static str>) -> Schema {
    json_schema!({
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": phases},
            "reason": {"type": "string", "enum": reasons},
        },
        "required": ["phase"],
    })
}

impl JsonSchema for RunPhase {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "RunPhase".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut phases: Vec<&'static str> =
            RunPhase::all().into_iter().map(RunPhase::name).collect();
        phases.dedup();
        let mut reasons: Vec<&'static str> = RunPhase::all()
            .into_iter()
            .filter_map(RunPhase::reason)
            .collect();
        reasons.sort_unstable();
        reasons.dedup();
        phase_schema(phases, reasons)
    }
}

impl JsonSchema for GroupPhase {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "GroupPhase".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut phases: Vec<&'static str> =
            GroupPhase::ALL.into_iter().map(GroupPhase::name).collect();
        phases.dedup();
        let reasons = GroupPhase::ALL
            .into_iter()
            .filter_map(GroupPhase::reason)
            .collect();
        phase_schema(phases, reasons)
    }
}

/// A Secret as it is written: its values as `stringData`, never read back.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct SecretWrite {
    /// `nodus.dev/v1`.
    api_version: String,
    /// `Secret`.
    kind: String,
    /// Name, labels and annotations.
    #[serde(default)]
    metadata: ObjectMeta,
    /// A free-form type, such as `Opaque`.
    #[serde(rename = "type", default)]
    secret_type: Option<String>,
    /// The values by key; stored sealed, never shown.
    #[serde(default)]
    string_data: std::collections::BTreeMap<String, String>,
}

/// A Secret as it is written (`stringData`); [`secret_read_schema`] is how it reads.
pub fn secret_write_schema(generator: &mut SchemaGenerator) -> Schema {
    SecretWrite::json_schema(generator)
}

/// A Secret as it reads: its keys, never its values.
pub fn secret_read_schema(generator: &mut SchemaGenerator) -> Schema {
    SecretDocument::json_schema(generator)
}
