//! Post-run actions: work a run does after its agent has answered, contributed as
//! [`PostRunAction`]s (a kind such as `agents.webhook`, a title, a description and the JSON
//! Schema of its config) and installed in a [`Registry`]. Which action a run carries out is
//! decided when it is created, by [`Registry::choose`], from the agent's declared
//! `postRunActions` and the run's `spec.postRunAction` (the rules table of docs/concepts.md);
//! an unknown kind or a malformed config fails the request, not the run.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::resource::PostRunAction as PostRunActionSpec;
use crate::resource::SecretKeyRef;
use crate::secret::PinnedSecrets;
use crate::validate::Invalid;

/// The kind that does nothing: the default of an agent that declares no actions.
pub const NOOP: &str = "agents.noop";

/// What an action is given.
#[derive(Debug, Clone)]
pub struct ActionContext {
    /// The run's `project/name`.
    pub run: String,
    /// A key that stays the same when the action is carried out again after a restart (the
    /// run's uid and the step), for receivers that deduplicate.
    pub idempotency_key: String,
    /// Its config, as checked at creation (`{}` when the run gave none).
    pub config: Value,
    /// The run record (the `runRecord` result).
    pub run_record: Value,
    /// The values of the Secret keys its config refers to ([`PostRunAction::secret_refs`]),
    /// as they were when the run was created.
    pub secrets: PinnedSecrets,
}

/// What an action saves among the run's results, by name.
pub type ActionResults = BTreeMap<String, Vec<u8>>;

/// Work a run does after its agent has answered.
#[async_trait]
pub trait PostRunAction: Send + Sync {
    /// Its kind, a dotted name (`agents.webhook`).
    fn kind(&self) -> &'static str;
    /// A short title.
    fn title(&self) -> &'static str;
    /// What it does, in a sentence.
    fn description(&self) -> &'static str;
    /// The JSON Schema of its config.
    fn config_schema(&self) -> Value;
    /// Why `config` is not one this action takes, naming the field under `config`, or `Ok`.
    fn check_config(&self, config: &Value) -> Result<(), Invalid>;
    /// The Secret keys a checked `config` refers to, each with the field under `config` that
    /// names it: their values are read when the run is created (a missing one fails the
    /// request), kept sealed beside the run and given to [`PostRunAction::run`] in
    /// [`ActionContext::secrets`]. None by default.
    fn secret_refs(&self, config: &Value) -> Vec<(String, SecretKeyRef)> {
        let _ = config;
        Vec::new()
    }
    /// Carry it out; what it saves becomes results of the run. An error fails the run (its
    /// other results are saved first).
    async fn run(&self, context: &ActionContext) -> Result<ActionResults, String>;
}

/// An action as listed (`GET /apis/nodus.dev/v1/postrunactions`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ActionInfo {
    /// Its kind.
    pub kind: String,
    /// Its title.
    pub title: String,
    /// What it does.
    pub description: String,
    /// The JSON Schema of its config.
    pub config_schema: Value,
}

/// The action a run carries out, chosen when it is created.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    /// Its kind.
    pub kind: String,
    /// Its config (`{}` when none was given).
    pub config: Value,
}

/// The installed actions, by kind.
#[derive(Clone, Default)]
pub struct Registry {
    actions: BTreeMap<&'static str, Arc<dyn PostRunAction>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.actions.keys()).finish()
    }
}

impl Registry {
    /// A registry with only [`Noop`].
    pub fn new() -> Self {
        Registry::default().with(Arc::new(Noop))
    }

    /// With one more action (replacing one of the same kind).
    pub fn with(mut self, action: Arc<dyn PostRunAction>) -> Self {
        self.actions.insert(action.kind(), action);
        self
    }

    /// With every action of `other` too (replacing those of the same kinds).
    pub fn merged(mut self, other: &Registry) -> Self {
        for (kind, action) in &other.actions {
            self.actions.insert(kind, action.clone());
        }
        self
    }

    /// The action of `kind`, if installed.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn PostRunAction>> {
        self.actions.get(kind)
    }

    /// Every installed action, by kind.
    pub fn list(&self) -> Vec<ActionInfo> {
        self.actions
            .values()
            .map(|action| ActionInfo {
                kind: action.kind().to_string(),
                title: action.title().to_string(),
                description: action.description().to_string(),
                config_schema: action.config_schema(),
            })
            .collect()
    }

    fn installed(&self) -> String {
        self.actions.keys().copied().collect::<Vec<_>>().join(", ")
    }

    /// Check an agent's declared `postRunActions`: each kind must be installed.
    pub fn check_declared(&self, declared: Option<&[String]>) -> Result<(), Invalid> {
        for (index, kind) in declared.unwrap_or_default().iter().enumerate() {
            if self.get(kind).is_none() {
                return Err(Invalid::new(
                    format!("spec.postRunActions[{index}]"),
                    format!(
                        "must be an installed post-run action ({})",
                        self.installed()
                    ),
                    format!("{kind:?}"),
                ));
            }
        }
        Ok(())
    }

    /// The action a run carries out, by the rules of what an agent declares (`declared`:
    /// `None` for an agent that declares nothing, which allows only [`NOOP`]; `inline` for an
    /// agent written in the run, which declares nothing and allows any installed kind) and
    /// what the run asks for:
    ///
    /// | declared | run names none | run names a kind |
    /// |---|---|---|
    /// | includes `agents.noop` | `agents.noop` | a declared kind |
    /// | exactly one kind | that kind, config `{}` | that kind |
    /// | several, not `agents.noop` | refused: the run must choose | a declared kind |
    /// | inline agent | `agents.noop` | any installed kind |
    pub fn choose(
        &self,
        declared: Option<&[String]>,
        inline: bool,
        requested: Option<&PostRunActionSpec>,
    ) -> Result<Chosen, Invalid> {
        let noop = [NOOP.to_string()];
        let allowed: &[String] = match declared {
            Some(kinds) if !inline => kinds,
            _ => &noop,
        };
        let Some(requested) = requested else {
            let kind = if inline || allowed.iter().any(|k| k == NOOP) {
                NOOP.to_string()
            } else if let [only] = allowed {
                only.clone()
            } else {
                return Err(Invalid::new(
                    "spec.postRunAction",
                    format!(
                        "is required: the agent declares several post-run actions ({}) and not \
                         agents.noop, so the run must choose one",
                        allowed.join(", ")
                    ),
                    "nothing",
                ));
            };
            return self.with_config(&kind, None);
        };
        let kind = &requested.kind;
        if !inline && !allowed.contains(kind) {
            return Err(Invalid::new(
                "spec.postRunAction.kind",
                format!(
                    "must be one of the agent's postRunActions ({}{})",
                    allowed.join(", "),
                    if declared.is_none() {
                        ": the agent declares none, which allows only agents.noop"
                    } else {
                        ""
                    }
                ),
                format!("{kind:?}"),
            ));
        }
        self.with_config(kind, requested.config.as_ref())
    }

    fn with_config(&self, kind: &str, config: Option<&Value>) -> Result<Chosen, Invalid> {
        let Some(action) = self.get(kind) else {
            return Err(Invalid::new(
                "spec.postRunAction.kind",
                format!(
                    "must be an installed post-run action ({})",
                    self.installed()
                ),
                format!("{kind:?}"),
            ));
        };
        let config = config
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        action.check_config(&config).map_err(|e| Invalid {
            field: format!("spec.postRunAction.config{}", e.field),
            ..e
        })?;
        Ok(Chosen {
            kind: kind.to_string(),
            config,
        })
    }
}

/// `agents.noop`: does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

#[async_trait]
impl PostRunAction for Noop {
    fn kind(&self) -> &'static str {
        NOOP
    }
    fn title(&self) -> &'static str {
        "No action"
    }
    fn description(&self) -> &'static str {
        "Does nothing: the run ends when its agent has answered."
    }
    fn config_schema(&self) -> Value {
        serde_json::json!({"type": "object", "additionalProperties": false})
    }
    fn check_config(&self, config: &Value) -> Result<(), Invalid> {
        match config.as_object() {
            Some(fields) => match fields.keys().next() {
                None => Ok(()),
                Some(key) => Err(Invalid::new(
                    format!(".{key}"),
                    "unknown field: agents.noop takes no config",
                    format!("{key:?}"),
                )),
            },
            None => Err(Invalid::new("", "must be an object", config.to_string())),
        }
    }
    async fn run(&self, _: &ActionContext) -> Result<ActionResults, String> {
        Ok(ActionResults::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An action of another kind, for the rules.
    struct Named(&'static str);

    #[async_trait]
    impl PostRunAction for Named {
        fn kind(&self) -> &'static str {
            self.0
        }
        fn title(&self) -> &'static str {
            "named"
        }
        fn description(&self) -> &'static str {
            "a test action"
        }
        fn config_schema(&self) -> Value {
            serde_json::json!({"type": "object"})
        }
        fn check_config(&self, config: &Value) -> Result<(), Invalid> {
            match config.get("bad") {
                Some(value) => Err(Invalid::new(".bad", "is refused", value.to_string())),
                None => Ok(()),
            }
        }
        async fn run(&self, _: &ActionContext) -> Result<ActionResults, String> {
            Ok(ActionResults::new())
        }
    }

    fn registry() -> Registry {
        Registry::new()
            .with(Arc::new(Named("a.one")))
            .with(Arc::new(Named("a.two")))
    }

    fn ask(kind: &str) -> PostRunActionSpec {
        PostRunActionSpec {
            kind: kind.to_string(),
            config: None,
        }
    }

    fn kinds(list: &[&str]) -> Vec<String> {
        list.iter().map(|k| k.to_string()).collect()
    }

    /// The rules table, row by row, each cell checked.
    #[test]
    fn the_rules_table_row_by_row() {
        let registry = registry();
        let chosen = |declared: Option<Vec<String>>, inline: bool, requested: Option<&str>| {
            registry
                .choose(declared.as_deref(), inline, requested.map(ask).as_ref())
                .map(|c| c.kind)
                .map_err(|e| e.field)
        };
        // Declared includes agents.noop.
        let with_noop = || Some(kinds(&[NOOP, "a.one"]));
        assert_eq!(chosen(with_noop(), false, None), Ok(NOOP.to_string()));
        assert_eq!(
            chosen(with_noop(), false, Some("a.one")),
            Ok("a.one".into())
        );
        assert_eq!(
            chosen(with_noop(), false, Some("a.two")),
            Err("spec.postRunAction.kind".into())
        );
        // Exactly one kind.
        let one = || Some(kinds(&["a.one"]));
        assert_eq!(chosen(one(), false, None), Ok("a.one".into()));
        assert_eq!(chosen(one(), false, Some("a.one")), Ok("a.one".into()));
        assert_eq!(
            chosen(one(), false, Some(NOOP)),
            Err("spec.postRunAction.kind".into())
        );
        // Several kinds, not agents.noop.
        let several = || Some(kinds(&["a.one", "a.two"]));
        assert_eq!(
            chosen(several(), false, None),
            Err("spec.postRunAction".into())
        );
        assert_eq!(chosen(several(), false, Some("a.two")), Ok("a.two".into()));
        assert_eq!(
            chosen(several(), false, Some(NOOP)),
            Err("spec.postRunAction.kind".into())
        );
        // Inline agent: no declaration.
        assert_eq!(chosen(None, true, None), Ok(NOOP.to_string()));
        assert_eq!(chosen(None, true, Some("a.two")), Ok("a.two".into()));
        assert_eq!(
            chosen(None, true, Some("not.installed")),
            Err("spec.postRunAction.kind".into())
        );
        // An agent that declares nothing allows only agents.noop.
        assert_eq!(chosen(None, false, None), Ok(NOOP.to_string()));
        assert_eq!(chosen(None, false, Some(NOOP)), Ok(NOOP.to_string()));
        assert_eq!(
            chosen(None, false, Some("a.one")),
            Err("spec.postRunAction.kind".into())
        );
    }

    #[test]
    fn a_config_is_checked_by_its_action_and_an_omitted_one_is_empty() {
        let registry = registry();
        let refused = registry
            .choose(
                None,
                true,
                Some(&PostRunActionSpec {
                    kind: "a.one".into(),
                    config: Some(serde_json::json!({"bad": 1})),
                }),
            )
            .expect_err("refused");
        assert_eq!(refused.field, "spec.postRunAction.config.bad");
        let chosen = registry
            .choose(Some(&kinds(&["a.one"])), false, None)
            .expect("the only kind");
        assert_eq!(chosen.config, serde_json::json!({}));
        let noop = registry
            .choose(
                None,
                false,
                Some(&PostRunActionSpec {
                    kind: NOOP.into(),
                    config: Some(serde_json::json!({"x": 1})),
                }),
            )
            .expect_err("noop takes no config");
        assert_eq!(noop.field, "spec.postRunAction.config.x");
        assert_eq!(
            registry.check_declared(Some(&kinds(&["a.one", "b.missing"]))),
            Err(Invalid::new(
                "spec.postRunActions[1]",
                "must be an installed post-run action (a.one, a.two, agents.noop)",
                "\"b.missing\""
            ))
        );
    }
}
