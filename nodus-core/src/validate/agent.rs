//! The rules of an Agent: its system prompt, model access, limits, context schema and
//! post-run actions.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use serde_json::Value;

use super::display::{NOTHING, SHOWN_CHARS, Step, field_path, shorten, shown_json, steps_to};
use super::environment::check_environment_ref;
use super::{
    Invalid, Result, Validate, check_dns_label, check_message, check_not_blank, check_range,
    context, shown,
};
use crate::resource::{Access, AgentSpec, ModelAccess};

/// Allowed `spec.maxTokens` of an Agent.
pub const MAX_TOKENS_RANGE: RangeInclusive<u32> = 1..=128_000;
/// Allowed `spec.maxToolCalls` of an Agent.
pub const MAX_TOOL_CALLS_RANGE: RangeInclusive<u32> = 1..=1000;
/// JSON Schema keywords that would make a `contextSchema` depend on other documents.
const REFERENCE_KEYWORDS: [&str; 3] = ["$ref", "$dynamicRef", "$recursiveRef"];
impl Validate for AgentSpec {
    fn check_spec(&self) -> Result<()> {
        check_message("spec.system", &self.system)?;
        check_model(&self.model)?;
        check_range("spec.maxTokens", self.max_tokens, MAX_TOKENS_RANGE)?;
        check_range(
            "spec.maxToolCalls",
            self.max_tool_calls,
            MAX_TOOL_CALLS_RANGE,
        )?;
        if let Some(schema) = &self.context_schema {
            check_context_schema(schema)?;
        }
        if let Some(input) = &self.default_input {
            check_message("spec.defaultInput", input)?;
        }
        if let Some(actions) = &self.post_run_actions {
            if actions.is_empty() {
                return Err(Invalid::new(
                    "spec.postRunActions",
                    "must list at least one action kind when set",
                    "[]",
                ));
            }
            for (index, action) in actions.iter().enumerate() {
                check_not_blank(&format!("spec.postRunActions[{index}]"), action)?;
            }
        }
        if let Some(environment) = &self.environment {
            check_environment_ref("spec.environment", environment)?;
        }
        Ok(())
    }
}

fn check_model(model: &ModelAccess) -> Result<()> {
    match model.access {
        Access::Byok => {
            if let Some(families) = &model.families {
                return Err(Invalid::new(
                    "spec.model.families",
                    "must not be set with access BYOK, which names one model",
                    shorten(&family_list(families), SHOWN_CHARS),
                ));
            }
            match &model.name {
                None => {
                    return Err(Invalid::new(
                        "spec.model.name",
                        "required with access BYOK",
                        NOTHING,
                    ));
                }
                Some(name) => check_not_blank("spec.model.name", name)?,
            }
            match &model.api_key_secret {
                None => {
                    return Err(Invalid::new(
                        "spec.model.apiKeySecret",
                        "required with access BYOK",
                        NOTHING,
                    ));
                }
                Some(secret) => check_dns_label("spec.model.apiKeySecret", secret)?,
            }
        }
        Access::Nodus => {
            if let Some(secret) = &model.api_key_secret {
                return Err(Invalid::new(
                    "spec.model.apiKeySecret",
                    "must not be set with access Nodus, which needs no key",
                    shown(secret),
                ));
            }
            if let Some(name) = &model.name {
                check_not_blank("spec.model.name", name)?;
            }
        }
    }
    if let Some(families) = &model.families {
        if families.is_empty() {
            return Err(Invalid::new(
                "spec.model.families",
                "must list at least one family when set",
                "[]",
            ));
        }
        let mut seen = BTreeSet::new();
        for (index, family) in families.iter().enumerate() {
            if !seen.insert(*family) {
                return Err(Invalid::new(
                    format!("spec.model.families[{index}]"),
                    "must not repeat a family",
                    family.as_str(),
                ));
            }
        }
    }
    Ok(())
}

fn family_list(families: &[crate::catalog::Family]) -> String {
    let names: Vec<&str> = families.iter().map(|family| family.as_str()).collect();
    format!("[{}]", names.join(", "))
}

/// A JSON object with no reference keyword anywhere (walked without recursion), and a valid
/// JSON Schema 2020-12 document.
fn check_context_schema(schema: &Value) -> Result<()> {
    const PREFIX: [Step<'static>; 2] = [Step::Key("spec"), Step::Key("contextSchema")];
    if !schema.is_object() {
        return Err(Invalid::new(
            field_path(&PREFIX),
            "must be a JSON Schema object",
            shown_json(Some(schema)),
        ));
    }
    // Every visited node with its parent, so that a path is built only for an error.
    let mut nodes: Vec<(Option<usize>, Step<'_>)> = Vec::new();
    let mut pending: Vec<(&Value, Option<usize>)> = vec![(schema, None)];
    while let Some((value, node)) = pending.pop() {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    nodes.push((node, Step::Key(key)));
                    let child_node = nodes.len() - 1;
                    if REFERENCE_KEYWORDS.contains(&key.as_str()) {
                        let mut steps = Vec::from(PREFIX);
                        steps.extend(steps_to(&nodes, child_node));
                        return Err(Invalid::new(
                            field_path(&steps),
                            "must not use $ref, $dynamicRef or $recursiveRef: \
                             the schema must be self-contained",
                            shown_json(Some(child)),
                        ));
                    }
                    pending.push((child, Some(child_node)));
                }
            }
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    nodes.push((node, Step::Index(index)));
                    pending.push((item, Some(nodes.len() - 1)));
                }
            }
            _ => {}
        }
    }
    context::check_schema(schema)
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
