//! Agent rules.

use serde_json::json;

use crate::resource::*;
use crate::validate::test_support::*;
use crate::validate::*;

// ---- Agent ----

#[test]
fn agent_rules() {
    check::<AgentSpec>(vec![
        (
            with(agent(), "/spec/system", json!("")),
            "spec.system",
            "must not be empty",
        ),
        (
            with(agent(), "/spec/system", json!(long(MAX_INPUT_BYTES + 1))),
            "spec.system",
            "(262145 bytes)",
        ),
        (
            with(agent(), "/spec/maxTokens", json!(0)),
            "spec.maxTokens",
            "between 1 and 128000 (got 0)",
        ),
        (
            with(agent(), "/spec/maxTokens", json!(128_001)),
            "spec.maxTokens",
            "128001",
        ),
        (
            with(agent(), "/spec/maxToolCalls", json!(0)),
            "spec.maxToolCalls",
            "between 1 and 1000 (got 0)",
        ),
        (
            with(agent(), "/spec/maxToolCalls", json!(1001)),
            "spec.maxToolCalls",
            "1001",
        ),
        (
            with(agent(), "/spec/model/families", json!([])),
            "spec.model.families",
            "[]",
        ),
        (
            with(
                agent(),
                "/spec/model/families",
                json!(["haiku", "sonnet", "haiku"]),
            ),
            "spec.model.families[2]",
            "haiku",
        ),
        (
            with(agent(), "/spec/model/apiKeySecret", json!("anthropic-key")),
            "spec.model.apiKeySecret",
            "anthropic-key",
        ),
        (
            with(agent(), "/spec/model/name", json!(" ")),
            "spec.model.name",
            "\" \"",
        ),
        (
            without(byok_agent(), "/spec/model/name"),
            "spec.model.name",
            "required",
        ),
        (
            with(byok_agent(), "/spec/model/name", json!("")),
            "spec.model.name",
            "\"\"",
        ),
        (
            without(byok_agent(), "/spec/model/apiKeySecret"),
            "spec.model.apiKeySecret",
            "required",
        ),
        (
            with(
                byok_agent(),
                "/spec/model/apiKeySecret",
                json!("Anthropic_Key"),
            ),
            "spec.model.apiKeySecret",
            "Anthropic_Key",
        ),
        (
            with(byok_agent(), "/spec/model/families", json!(["haiku"])),
            "spec.model.families",
            "[haiku]",
        ),
        (
            with(agent(), "/spec/defaultInput", json!("")),
            "spec.defaultInput",
            "\"\"",
        ),
        (
            with(
                agent(),
                "/spec/defaultInput",
                json!(long(MAX_INPUT_BYTES + 1)),
            ),
            "spec.defaultInput",
            "(262145 bytes)",
        ),
        (
            with(agent(), "/spec/contextSchema", json!("object")),
            "spec.contextSchema",
            "\"object\"",
        ),
        (
            with(agent(), "/spec/contextSchema", json!([])),
            "spec.contextSchema",
            "[]",
        ),
        (
            with(
                agent(),
                "/spec/contextSchema",
                json!({ "$ref": "https://x/s.json" }),
            ),
            "spec.contextSchema.$ref",
            "https://x/s.json",
        ),
        (
            with(
                agent(),
                "/spec/contextSchema",
                json!({ "type": "object", "properties": { "a": { "items": [{}, { "$dynamicRef": "#x" }] } } }),
            ),
            "spec.contextSchema.properties.a.items[1].$dynamicRef",
            "#x",
        ),
        (
            with(
                agent(),
                "/spec/contextSchema",
                json!({ "anyOf": [{ "$recursiveRef": "#" }] }),
            ),
            "spec.contextSchema.anyOf[0].$recursiveRef",
            "\"#\"",
        ),
        (
            with(agent(), "/spec/postRunActions", json!([])),
            "spec.postRunActions",
            "[]",
        ),
        (
            with(agent(), "/spec/postRunActions", json!(["agents.noop", ""])),
            "spec.postRunActions[1]",
            "\"\"",
        ),
    ]);
    accept::<AgentSpec>(with(
        agent(),
        "/spec/postRunActions",
        json!(["agents.noop", "git.push"]),
    ));
    #[cfg(feature = "context-schema")]
    accept::<AgentSpec>(with(
        agent(),
        "/spec/contextSchema",
        json!({ "type": "object", "properties": { "ticket": { "type": "integer" } }, "required": ["ticket"] }),
    ));
    for limit in [1, 128_000] {
        accept::<AgentSpec>(with(agent(), "/spec/maxTokens", json!(limit)));
    }
    for limit in [1, 1000] {
        accept::<AgentSpec>(with(agent(), "/spec/maxToolCalls", json!(limit)));
    }
}

#[test]
fn a_deep_context_schema_gives_a_bounded_path() {
    let mut schema = json!({ "$ref": "#" });
    for _ in 0..60 {
        schema = json!({ "not": schema });
    }
    let error =
        parse::<AgentSpec>(with(agent(), "/spec/contextSchema", schema)).expect_err("a reference");
    assert!(error.field.starts_with("spec.contextSchema.not"), "{error}");
    assert!(error.field.ends_with("not.$ref"), "{error}");
    assert!(error.field.contains('…'), "{error}");
    assert!(error.field.len() < 200, "{error}");
}
