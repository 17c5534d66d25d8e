//! The kinds users name on the command line (the names are nodus-core's kind registry:
//! plurals, singulars, short names such as `ar`, `ag`), and `KIND/NAME` targets.

use nodus_core::resource::Kind;

use crate::error::{Error, Result};

/// The API group in qualified names (`agentrun.nodus.dev/NAME`).
pub const GROUP: &str = "nodus.dev";

/// The kind users write that the command line names: `agentrun`, `agentruns`, `ar`,
/// `AgentRun`, `agentrun.nodus.dev` (the names are the registry's, [`Kind::named`]).
pub fn named(text: &str) -> Option<Kind> {
    let lower = text.to_ascii_lowercase();
    Kind::named(lower.strip_suffix(".nodus.dev").unwrap_or(lower.as_str()))
}

/// `agentrun.nodus.dev/NAME`, as kubectl names objects in its messages.
pub fn qualified(kind: Kind, name: &str) -> String {
    format!("{}.{GROUP}/{name}", kind.singular())
}

/// Whether objects of this kind can be cancelled (runs and groups).
pub fn cancellable(kind: Kind) -> bool {
    matches!(kind, Kind::AgentRun | Kind::AgentGroup)
}

/// Every kind users write as the command line names it, from [`Kind::WRITABLE`]:
/// `agents, agentruns (ar), …`.
pub fn kinds_list() -> String {
    let names: Vec<String> = Kind::WRITABLE
        .iter()
        .map(|kind| match kind.short_name() {
            Some(short) => format!("{} ({short})", kind.plural()),
            None => kind.plural().to_string(),
        })
        .collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

fn unknown_kind(text: &str) -> Error {
    Error::usage(format!(
        "the server doesn't have a resource type {text:?}; there are {}",
        kinds_list()
    ))
}

/// A kind named on the command line, or an error listing the kinds.
pub fn parse_kind(text: &str) -> Result<Kind> {
    named(text).ok_or_else(|| unknown_kind(text))
}

/// `KIND/NAME` as one argument.
pub fn parse_target(text: &str) -> Result<(Kind, String)> {
    let (kind, name) = text.split_once('/').ok_or_else(|| {
        Error::usage(format!(
            "{text:?} is not KIND/NAME (for example agentrun/hello-agent-run)"
        ))
    })?;
    if name.is_empty() || name.contains('/') {
        return Err(Error::usage(format!("{text:?} is not KIND/NAME")));
    }
    Ok((parse_kind(kind)?, name.to_string()))
}

/// The targets of `get`/`delete`: `KIND`, `KIND NAME…`, or `KIND/NAME…`. An empty list of
/// names means every object of the kind.
pub fn parse_targets(arguments: &[String]) -> Result<(Kind, Vec<String>)> {
    let Some(first) = arguments.first() else {
        return Err(Error::usage(
            "name a resource type, such as agentruns, or KIND/NAME",
        ));
    };
    if first.contains('/') {
        let mut kind = None;
        let mut names = Vec::new();
        for argument in arguments {
            let (this, name) = parse_target(argument)?;
            if kind.is_some_and(|k| k != this) {
                return Err(Error::usage(
                    "name objects of one kind at a time (KIND/NAME KIND/NAME …)",
                ));
            }
            kind = Some(this);
            names.push(name);
        }
        let kind = kind.ok_or_else(|| Error::usage("no target"))?;
        return Ok((kind, names));
    }
    let kind = parse_kind(first)?;
    let names = arguments[1..].to_vec();
    if let Some(bad) = names.iter().find(|n| n.contains('/')) {
        return Err(Error::usage(format!(
            "there is a resource type already ({first}); {bad:?} should be a plain name"
        )));
    }
    Ok((kind, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_plurals_and_short_names_all_resolve() {
        let cases = [
            ("agent", Kind::Agent),
            ("agents", Kind::Agent),
            ("Agent", Kind::Agent),
            ("agentrun", Kind::AgentRun),
            ("agentruns", Kind::AgentRun),
            ("ar", Kind::AgentRun),
            ("agentrun.nodus.dev", Kind::AgentRun),
            ("AgentRuns.nodus.dev", Kind::AgentRun),
            ("ag", Kind::AgentGroup),
            ("agentgroups", Kind::AgentGroup),
            ("secret", Kind::Secret),
            ("budgets", Kind::Budget),
            ("fs", Kind::FileSet),
            ("FileSet", Kind::FileSet),
            ("ae", Kind::AgentEnvironment),
            ("env", Kind::Environment),
        ];
        for (text, kind) in cases {
            assert_eq!(named(text), Some(kind), "{text}");
        }
        assert_eq!(named("pods"), None);
        assert_eq!(named("accounts"), None, "a kind Nodus keeps is not named");
        assert_eq!(
            parse_kind("pods").expect_err("unknown").to_string(),
            "the server doesn't have a resource type \"pods\"; there are agents, agentruns \
             (ar), agentgroups (ag), secrets, budgets, filesets (fs), agentenvironments (ae) \
             and environments (env)"
        );
    }

    #[test]
    fn kinds_are_qualified_as_kubectl_does() {
        assert_eq!(qualified(Kind::AgentGroup, "p"), "agentgroup.nodus.dev/p");
        assert_eq!(
            qualified(Kind::AgentEnvironment, "e"),
            "agentenvironment.nodus.dev/e"
        );
        assert!(cancellable(Kind::AgentRun) && cancellable(Kind::AgentGroup));
        assert!(!cancellable(Kind::Agent));
    }

    #[test]
    fn targets_come_as_kind_slash_name_or_kind_then_names() {
        assert_eq!(
            parse_target("ag/parallel-agents").expect("valid"),
            (Kind::AgentGroup, "parallel-agents".to_string())
        );
        assert!(parse_target("agentrun").is_err());
        assert!(parse_target("agentrun/").is_err());
        assert!(parse_target("agentrun/a/b").is_err());
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_targets(&args(&["ar"])).expect("valid"),
            (Kind::AgentRun, vec![])
        );
        assert_eq!(
            parse_targets(&args(&["agentrun", "a", "b"])).expect("valid"),
            (Kind::AgentRun, vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(
            parse_targets(&args(&["ar/a", "agentrun/b"])).expect("valid"),
            (Kind::AgentRun, vec!["a".to_string(), "b".to_string()])
        );
        assert!(parse_targets(&args(&["ar/a", "ag/b"])).is_err());
        assert!(parse_targets(&args(&["ar", "ag/b"])).is_err());
        assert!(parse_targets(&[]).is_err());
    }
}
