//! An agent's `contextSchema` (JSON Schema 2020-12, self-contained) and a run's `context`
//! checked against it; the checking needs nodus-core's `context-schema` feature.

use serde_json::{Map, Value};

use super::{Invalid, Result, shown_json};
#[cfg(feature = "context-schema")]
use super::{NOTHING, display::Step, display::field_path};

/// The feature of nodus-core that checks contexts against schemas.
pub const FEATURE: &str = "context-schema";
/// The only dialect a `$schema` may name.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// Checks a `contextSchema` that is already known to be an object without reference
/// keywords: it names no other dialect and is a valid JSON Schema 2020-12 document.
pub(super) fn check_schema(schema: &Value) -> Result<()> {
    if let Some(dialect) = schema.get("$schema")
        && dialect.as_str().map(|d| d.trim_end_matches('#')) != Some(DIALECT)
    {
        return Err(Invalid::new(
            "spec.contextSchema.$schema",
            format!("must be {DIALECT:?} when given: contexts are checked by JSON Schema 2020-12"),
            shown_json(Some(dialect)),
        ));
    }
    compile(schema).map(|_| ())
}

/// Checks a run's `context` against its agent's `contextSchema`. A run without a context is
/// checked as the empty object, so a schema that requires a property refuses it. The error
/// names the failing path under `spec.context`, the schema keyword and where it is.
pub fn check_context(schema: &Value, context: Option<&Map<String, Value>>) -> Result<()> {
    check_schema(schema)?;
    check_instance(schema, context)
}

#[cfg(not(feature = "context-schema"))]
fn compile(schema: &Value) -> Result<()> {
    Err(Invalid::new(
        "spec.contextSchema",
        format!(
            "cannot be checked by this build: it leaves out nodus-core's `{FEATURE}` feature, \
             which checks contexts against a schema (remove the schema or enable the feature)"
        ),
        shown_json(Some(schema)),
    ))
}

#[cfg(not(feature = "context-schema"))]
fn check_instance(_schema: &Value, _context: Option<&Map<String, Value>>) -> Result<()> {
    Ok(())
}

#[cfg(feature = "context-schema")]
fn compile(schema: &Value) -> Result<jsonschema::Validator> {
    jsonschema::draft202012::new(schema).map_err(|error| {
        let mut steps = vec![Step::Key("spec"), Step::Key("contextSchema")];
        let segments = pointer_segments(error.instance_path().as_str());
        steps.extend(steps_in(schema, &segments));
        Invalid::new(
            field_path(&steps),
            format!(
                "must be a valid JSON Schema 2020-12 document: {} (meta-schema keyword {:?})",
                error.masked(),
                error.kind().keyword()
            ),
            shown_json(Some(error.instance())),
        )
    })
}

#[cfg(feature = "context-schema")]
fn check_instance(schema: &Value, context: Option<&Map<String, Value>>) -> Result<()> {
    let validator = compile(schema)?;
    let instance = Value::Object(context.cloned().unwrap_or_default());
    let Err(error) = validator.validate(&instance) else {
        return Ok(());
    };
    let failed = format!(
        "{} (keyword {:?} at {})",
        error.masked(),
        error.kind().keyword(),
        schema_location(error.schema_path().as_str())
    );
    if context.is_none() {
        return Err(Invalid::new(
            "spec.context",
            format!("is required by the agent's contextSchema, which refuses no context: {failed}"),
            NOTHING,
        ));
    }
    let mut steps = vec![Step::Key("spec"), Step::Key("context")];
    let segments = pointer_segments(error.instance_path().as_str());
    steps.extend(steps_in(&instance, &segments));
    Err(Invalid::new(
        field_path(&steps),
        format!("must match the agent's contextSchema: {failed}"),
        shown_json(Some(error.instance())),
    ))
}

/// Where a keyword is in the schema, as a JSON pointer from `contextSchema`.
#[cfg(feature = "context-schema")]
fn schema_location(pointer: &str) -> String {
    format!("contextSchema#{pointer}")
}

/// The unescaped segments of a JSON pointer (`/a~1b/0` is `a/b`, `0`).
#[cfg(feature = "context-schema")]
fn pointer_segments(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .skip(1)
        .map(|segment| segment.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// The steps of `segments` inside `document`: a segment is an index where the value it
/// applies to is an array, a key otherwise.
#[cfg(feature = "context-schema")]
fn steps_in<'a>(document: &Value, segments: &'a [String]) -> Vec<Step<'a>> {
    let mut current = Some(document);
    segments
        .iter()
        .map(|segment| match (current, segment.parse::<usize>()) {
            (Some(Value::Array(items)), Ok(index)) => {
                current = items.get(index);
                Step::Index(index)
            }
            (value, _) => {
                current = value.and_then(|v| v.get(segment.as_str()));
                Step::Key(segment)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resource::AgentSpec;
    use crate::validate::parse;

    fn agent_with(schema: Value) -> Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": { "name": "typed" },
            "spec": {
                "system": "You help.",
                "model": { "access": "Nodus" },
                "perRunMaxCostUSD": "0.50",
                "contextSchema": schema,
            },
        })
    }

    #[cfg(feature = "context-schema")]
    fn ticket_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "ticket": {
                    "type": "object",
                    "properties": {
                        "id": { "type": "integer", "minimum": 1 },
                        "tags": { "type": "array", "items": { "type": "string" } },
                    },
                    "required": ["id"],
                },
            },
            "required": ["ticket"],
        })
    }

    #[cfg(feature = "context-schema")]
    fn context(value: Value) -> Map<String, Value> {
        value.as_object().expect("an object").clone()
    }

    #[cfg(feature = "context-schema")]
    #[test]
    fn a_valid_schema_is_accepted_and_an_invalid_one_refused_naming_the_path() {
        parse::<AgentSpec>(agent_with(ticket_schema())).expect("a valid schema");
        parse::<AgentSpec>(agent_with(json!({ "$schema": DIALECT, "type": "object" })))
            .expect("the 2020-12 dialect named");
        let cases = [
            (
                json!({ "type": "objekt" }),
                "spec.contextSchema.type",
                "\"objekt\"",
            ),
            (
                json!({ "properties": { "a": { "minimum": "one" } } }),
                "spec.contextSchema.properties.a.minimum",
                "\"one\"",
            ),
            (
                json!({ "anyOf": [{ "type": "string" }, { "required": "id" }] }),
                "spec.contextSchema.anyOf[1].required",
                "\"id\"",
            ),
            (
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
                "spec.contextSchema.$schema",
                "draft-07",
            ),
        ];
        for (schema, field, value) in cases {
            let error = parse::<AgentSpec>(agent_with(schema.clone())).expect_err("invalid");
            assert_eq!(error.field, field, "{schema}: {error}");
            assert!(error.value.contains(value), "{schema}: {error}");
        }
        let error = parse::<AgentSpec>(agent_with(json!({ "type": "objekt" }))).expect_err("bad");
        assert!(error.rule.contains("JSON Schema 2020-12"), "{error}");
    }

    #[test]
    fn a_reference_is_refused_naming_its_path() {
        let error = parse::<AgentSpec>(agent_with(json!({
            "type": "object",
            "properties": { "ticket": { "$ref": "#/$defs/ticket" } },
            "$defs": { "ticket": { "type": "integer" } },
        })))
        .expect_err("a reference");
        assert_eq!(error.field, "spec.contextSchema.properties.ticket.$ref");
        assert!(error.rule.contains("$ref"), "{error}");
        assert!(error.value.contains("#/$defs/ticket"), "{error}");
    }

    #[cfg(feature = "context-schema")]
    #[test]
    fn a_context_failing_at_a_nested_path_is_refused_naming_path_keyword_and_value() {
        let schema = ticket_schema();
        check_context(&schema, Some(&context(json!({ "ticket": { "id": 7 } }))))
            .expect("a matching context");
        let cases = [
            (
                json!({ "ticket": { "id": "seven" } }),
                "spec.context.ticket.id",
                "\"type\" at contextSchema#/properties/ticket/properties/id/type",
                "\"seven\"",
            ),
            (
                json!({ "ticket": { "id": 0 } }),
                "spec.context.ticket.id",
                "\"minimum\"",
                "0",
            ),
            (
                json!({ "ticket": { "id": 3, "tags": ["a", 5] } }),
                "spec.context.ticket.tags[1]",
                "\"type\"",
                "5",
            ),
            (
                json!({ "ticket": {} }),
                "spec.context.ticket",
                "\"required\"",
                "{}",
            ),
        ];
        for (given, field, rule, value) in cases {
            let error = check_context(&schema, Some(&context(given.clone()))).expect_err("refused");
            assert_eq!(error.field, field, "{given}: {error}");
            assert!(error.rule.contains("contextSchema"), "{given}: {error}");
            assert!(error.rule.contains(rule), "{given}: {error}");
            assert_eq!(error.value, value, "{given}: {error}");
        }
    }

    #[cfg(feature = "context-schema")]
    #[test]
    fn a_missing_context_is_refused_when_the_schema_requires_one() {
        let error = check_context(&ticket_schema(), None).expect_err("required");
        assert_eq!(error.field, "spec.context");
        assert_eq!(error.value, NOTHING);
        assert!(error.rule.contains("is required"), "{error}");
        assert!(error.rule.contains("\"ticket\""), "{error}");
        // A schema that requires nothing takes a run without a context.
        check_context(&json!({ "type": "object" }), None).expect("nothing required");
    }

    /// Without the `context-schema` feature (`cargo test -p nodus-core`), an agent with a
    /// contextSchema is refused naming the feature, and so is a run of one already stored.
    #[cfg(not(feature = "context-schema"))]
    #[test]
    fn without_the_feature_a_context_schema_is_refused_naming_it() {
        let error =
            parse::<AgentSpec>(agent_with(json!({ "type": "object" }))).expect_err("no checker");
        assert_eq!(error.field, "spec.contextSchema");
        assert!(error.rule.contains("`context-schema` feature"), "{error}");
        let error = check_context(&json!({ "type": "object" }), None).expect_err("no checker");
        assert!(error.rule.contains("`context-schema` feature"), "{error}");
    }
}
