//! `labelSelector` and `fieldSelector` query parameters, kubectl style: `a=b,c==d`.

use std::collections::BTreeMap;

use nodus_core::store::Selector;
use nodus_core::validate::Invalid;
use serde::Deserialize;

/// Fields a field selector may name. An agent's runs are listed by `spec.agent` (the agent
/// as the run names it) or by `status.snapshot.agentRef` (the `project/name` it resolved to
/// when it was created).
pub const SELECTABLE_FIELDS: [&str; 7] = [
    "metadata.name",
    "spec.agent",
    "spec.group",
    "spec.taskKey",
    "status.phase",
    "status.reason",
    "status.snapshot.agentRef",
];

/// The query of a list request.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    /// `key=value` pairs, comma-separated.
    pub label_selector: Option<String>,
    /// `path=value` pairs, comma-separated.
    pub field_selector: Option<String>,
}

fn pairs(parameter: &str, text: &str) -> Result<BTreeMap<String, String>, Invalid> {
    let mut pairs = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.contains("!=") {
            return Err(Invalid::new(
                parameter,
                "supports only equality (key=value)",
                format!("{part:?}"),
            ));
        }
        let (key, value) = part
            .split_once("==")
            .or_else(|| part.split_once('='))
            .ok_or_else(|| {
                Invalid::new(parameter, "is a list of key=value", format!("{part:?}"))
            })?;
        pairs.insert(key.trim().to_string(), value.trim().to_string());
    }
    Ok(pairs)
}

impl ListQuery {
    /// The selector, or an error naming the bad part.
    pub fn selector(&self) -> Result<Selector, Invalid> {
        let labels = pairs(
            "labelSelector",
            self.label_selector.as_deref().unwrap_or_default(),
        )?;
        let fields = pairs(
            "fieldSelector",
            self.field_selector.as_deref().unwrap_or_default(),
        )?;
        if let Some(field) = fields
            .keys()
            .find(|f| !SELECTABLE_FIELDS.contains(&f.as_str()))
        {
            return Err(Invalid::new(
                "fieldSelector",
                format!("can select on {}", SELECTABLE_FIELDS.join(", ")),
                format!("{field:?}"),
            ));
        }
        Ok(Selector { labels, fields })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubectl_selectors_and_refuses_the_rest() {
        let query = ListQuery {
            label_selector: Some("team=a, tier==gold".into()),
            field_selector: Some("spec.group=parallel-agents,status.phase=Running".into()),
        };
        let selector = query.selector().expect("valid");
        assert_eq!(selector.labels["tier"], "gold");
        assert_eq!(selector.fields["spec.group"], "parallel-agents");
        let agents = ListQuery {
            field_selector: Some("status.snapshot.agentRef=team/helper,spec.agent=helper".into()),
            ..Default::default()
        };
        let selector = agents.selector().expect("an agent's runs");
        assert_eq!(selector.fields["status.snapshot.agentRef"], "team/helper");
        assert_eq!(selector.fields["spec.agent"], "helper");
        let bad = ListQuery {
            field_selector: Some("spec.input=x".into()),
            ..Default::default()
        };
        assert_eq!(
            bad.selector().expect_err("not selectable").field,
            "fieldSelector"
        );
        let bad = ListQuery {
            label_selector: Some("a!=b".into()),
            ..Default::default()
        };
        assert!(bad.selector().is_err());
    }
}
