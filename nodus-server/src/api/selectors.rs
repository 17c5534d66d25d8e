//! `labelSelector` and `fieldSelector` query parameters, kubectl style: `a=b,c==d`.

use std::collections::BTreeMap;

use nodus_core::store::Selector;
use nodus_core::validate::{Invalid, shown};
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
    /// At most this many objects in the answer (1 to 1000); without it, all of them.
    pub limit: Option<String>,
    /// The `metadata.continue` of the previous answer: where this one starts.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

fn pairs(parameter: &str, text: &str) -> Result<BTreeMap<String, String>, Invalid> {
    let mut pairs = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.contains("!=") {
            return Err(Invalid::new(
                parameter,
                "supports only equality (key=value)",
                shown(part),
            ));
        }
        let (key, value) = part
            .split_once("==")
            .or_else(|| part.split_once('='))
            .ok_or_else(|| Invalid::new(parameter, "is a list of key=value", shown(part)))?;
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
                shown(field),
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
            ..Default::default()
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

    #[test]
    fn a_long_bad_part_is_shortened_in_the_error() {
        // Found by fuzz_any_selector_text_parses_or_names_the_parameter: the error echoed a
        // bad part whole, however long the query parameter was.
        let long = format!("a{}", "b".repeat(10_000));
        for query in [
            ListQuery {
                label_selector: Some(long.clone()),
                ..Default::default()
            },
            ListQuery {
                label_selector: Some(format!("{long}!=x")),
                ..Default::default()
            },
            ListQuery {
                field_selector: Some(format!("{long}=x")),
                ..Default::default()
            },
        ] {
            let error = query.selector().expect_err("refused");
            assert!(error.value.len() < 200, "{} bytes", error.value.len());
            assert!(error.value.starts_with("\"abbb"), "{}", error.value);
            assert!(error.value.contains("bytes)"), "{}", error.value);
        }
    }
}

/// Property-based fuzzing of selector parsing: any text is a selector or an error naming the
/// parameter (and echoing a bounded part of it); pairs written kubectl's ways parse back to
/// themselves.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// Keys and values as selectors carry them: no separator, no surrounding blanks.
    fn word() -> impl Strategy<Value = String> {
        "[^,=! \\t\\n\\r\\x0b\\x0c\\x85\\u{a0}\\u{1680}\\u{2000}-\\u{200a}\\u{2028}\\u{2029}\\u{202f}\\u{205f}\\u{3000}]{0,6}"
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "\\PC{0,40}",
            "[a-z.=!, ]{0,30}",
            prop::collection::vec(
                prop_oneof![
                    Just(",".to_string()),
                    Just("=".to_string()),
                    Just("==".to_string()),
                    Just("!=".to_string()),
                    Just(" ".to_string()),
                    prop::sample::select(SELECTABLE_FIELDS.to_vec()).prop_map(str::to_string),
                    "\\PC{0,5}",
                ],
                0..12,
            )
            .prop_map(|p| p.concat()),
            (1usize..20_000).prop_map(|n| format!("a{}", "b".repeat(n))),
        ]
    }

    proptest! {
        #[test]
        fn fuzz_any_selector_text_parses_or_names_the_parameter(
            labels in prop::option::of(text()),
            fields in prop::option::of(text()),
        ) {
            let query = ListQuery { label_selector: labels, field_selector: fields, ..Default::default() };
            match query.selector() {
                Ok(selector) => {
                    for field in selector.fields.keys() {
                        prop_assert!(SELECTABLE_FIELDS.contains(&field.as_str()));
                    }
                }
                Err(error) => {
                    prop_assert!(
                        error.field == "labelSelector" || error.field == "fieldSelector",
                        "{}", error
                    );
                    prop_assert!(!error.rule.is_empty());
                    prop_assert!(error.value.len() < 300, "echoes {} bytes", error.value.len());
                }
            }
        }

        #[test]
        fn fuzz_written_selectors_parse_back(
            labels in prop::collection::btree_map(word(), word(), 0..5),
            fields in prop::collection::btree_map(
                prop::sample::select(SELECTABLE_FIELDS.to_vec()).prop_map(str::to_string),
                word(),
                0..4,
            ),
            double in any::<bool>(),
            spaced in any::<bool>(),
        ) {
            let labels: BTreeMap<String, String> =
                labels.into_iter().filter(|(k, _)| !k.is_empty()).collect();
            let write = |pairs: &BTreeMap<String, String>| {
                let (eq, sep) = match (double, spaced) {
                    (true, true) => (" == ", " , "),
                    (true, false) => ("==", ","),
                    (false, true) => (" = ", ", "),
                    (false, false) => ("=", ","),
                };
                pairs
                    .iter()
                    .map(|(k, v)| format!("{k}{eq}{v}"))
                    .collect::<Vec<_>>()
                    .join(sep)
            };
            let query = ListQuery {
                label_selector: Some(write(&labels)),
                field_selector: Some(write(&fields)),
                ..Default::default()
            };
            let selector = query.selector().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(selector.labels, labels);
            prop_assert_eq!(selector.fields, fields);
        }
    }
}
