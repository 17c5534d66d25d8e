//! The kinds users name on the command line: full names, plurals, short names (`ar`, `ag`),
//! and `KIND/NAME` targets.

use std::fmt;

use crate::error::{Error, Result};

/// A kind of resource the CLI works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKind {
    /// A definition: system prompt, model access, cost cap.
    Agent,
    /// One conversation with an agent.
    AgentRun,
    /// Many runs of one agent under shared limits.
    AgentGroup,
    /// Key-value pairs stored encrypted.
    Secret,
    /// A cap on a project's total spend.
    Budget,
    /// Stored files that working directories are staged from.
    FileSet,
    /// Environment variables, Secrets bound to them, and compute for runs.
    AgentEnvironment,
    /// A versioned set of evaluation tasks and their grader (`NAME@VERSION`).
    Environment,
}

/// Every kind, in the order help texts list them.
pub const ALL: [ResourceKind; 8] = [
    ResourceKind::Agent,
    ResourceKind::AgentRun,
    ResourceKind::AgentGroup,
    ResourceKind::Secret,
    ResourceKind::Budget,
    ResourceKind::FileSet,
    ResourceKind::AgentEnvironment,
    ResourceKind::Environment,
];

/// The API group in qualified names (`agentrun.nodus.dev/NAME`).
pub const GROUP: &str = "nodus.dev";

impl ResourceKind {
    /// The kind named on the command line: `agentrun`, `agentruns`, `ar`, `AgentRun`,
    /// `agentrun.nodus.dev`.
    pub fn parse(text: &str) -> Option<ResourceKind> {
        let lower = text.to_ascii_lowercase();
        let bare = lower.strip_suffix(".nodus.dev").unwrap_or(lower.as_str());
        ALL.into_iter().find(|&kind| {
            bare == kind.singular() || bare == kind.plural() || short_name(kind) == Some(bare)
        })
    }

    /// The kind a document's `kind` field names (`AgentRun`), exactly.
    pub fn from_document_kind(kind: &str) -> Option<ResourceKind> {
        ALL.into_iter().find(|k| k.name() == kind)
    }

    /// The `kind` as documents spell it.
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::Agent => "Agent",
            ResourceKind::AgentRun => "AgentRun",
            ResourceKind::AgentGroup => "AgentGroup",
            ResourceKind::Secret => "Secret",
            ResourceKind::Budget => "Budget",
            ResourceKind::FileSet => "FileSet",
            ResourceKind::AgentEnvironment => "AgentEnvironment",
            ResourceKind::Environment => "Environment",
        }
    }

    /// The plural in REST paths (`agentruns`).
    pub fn plural(self) -> &'static str {
        match self {
            ResourceKind::Agent => "agents",
            ResourceKind::AgentRun => "agentruns",
            ResourceKind::AgentGroup => "agentgroups",
            ResourceKind::Secret => "secrets",
            ResourceKind::Budget => "budgets",
            ResourceKind::FileSet => "filesets",
            ResourceKind::AgentEnvironment => "agentenvironments",
            ResourceKind::Environment => "environments",
        }
    }

    /// The lower-case singular (`agentrun`).
    pub fn singular(self) -> String {
        self.name().to_ascii_lowercase()
    }

    /// `agentrun.nodus.dev/NAME`, as kubectl names objects in its messages.
    pub fn qualified(self, name: &str) -> String {
        format!("{}.{GROUP}/{name}", self.singular())
    }

    /// Where `apply` puts documents of this kind: what others refer to goes first (Secrets
    /// and Budgets, FileSets, Agents), then groups, then runs. `delete -f` goes the other way.
    pub fn apply_rank(self) -> u8 {
        match self {
            ResourceKind::Secret | ResourceKind::Budget => 0,
            ResourceKind::FileSet | ResourceKind::AgentEnvironment => 1,
            ResourceKind::Agent | ResourceKind::Environment => 2,
            ResourceKind::AgentGroup => 3,
            ResourceKind::AgentRun => 4,
        }
    }

    /// Whether runs of this kind can be cancelled.
    pub fn cancellable(self) -> bool {
        matches!(self, ResourceKind::AgentRun | ResourceKind::AgentGroup)
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The short name of a kind on the command line, if it has one (`ar`).
pub fn short_name(kind: ResourceKind) -> Option<&'static str> {
    match kind {
        ResourceKind::AgentRun => Some("ar"),
        ResourceKind::AgentGroup => Some("ag"),
        ResourceKind::FileSet => Some("fs"),
        ResourceKind::AgentEnvironment => Some("ae"),
        ResourceKind::Environment => Some("env"),
        _ => None,
    }
}

/// Every kind as the command line names it, from [`ALL`]: `agents, agentruns (ar), …`.
pub fn kinds_list() -> String {
    let names: Vec<String> = ALL
        .iter()
        .map(|&kind| match short_name(kind) {
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
pub fn parse_kind(text: &str) -> Result<ResourceKind> {
    ResourceKind::parse(text).ok_or_else(|| unknown_kind(text))
}

/// `KIND/NAME` as one argument.
pub fn parse_target(text: &str) -> Result<(ResourceKind, String)> {
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
pub fn parse_targets(arguments: &[String]) -> Result<(ResourceKind, Vec<String>)> {
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
            ("agent", ResourceKind::Agent),
            ("agents", ResourceKind::Agent),
            ("Agent", ResourceKind::Agent),
            ("agentrun", ResourceKind::AgentRun),
            ("agentruns", ResourceKind::AgentRun),
            ("ar", ResourceKind::AgentRun),
            ("agentrun.nodus.dev", ResourceKind::AgentRun),
            ("ag", ResourceKind::AgentGroup),
            ("agentgroups", ResourceKind::AgentGroup),
            ("secret", ResourceKind::Secret),
            ("budgets", ResourceKind::Budget),
            ("fs", ResourceKind::FileSet),
            ("FileSet", ResourceKind::FileSet),
        ];
        for (text, kind) in cases {
            assert_eq!(ResourceKind::parse(text), Some(kind), "{text}");
        }
        assert_eq!(ResourceKind::parse("pods"), None);
        let message = parse_kind("pods").expect_err("unknown").to_string();
        for kind in ALL {
            assert!(message.contains(kind.plural()), "{kind} in {message}");
            if let Some(short) = short_name(kind) {
                assert_eq!(ResourceKind::parse(short), Some(kind));
            }
        }
        assert!(
            parse_kind("pods")
                .expect_err("unknown")
                .to_string()
                .contains("agentruns (ar)")
        );
    }

    #[test]
    fn kinds_know_their_wire_names() {
        assert_eq!(ResourceKind::AgentRun.plural(), "agentruns");
        assert_eq!(
            ResourceKind::AgentGroup.qualified("p"),
            "agentgroup.nodus.dev/p"
        );
        assert_eq!(
            ResourceKind::from_document_kind("AgentGroup"),
            Some(ResourceKind::AgentGroup)
        );
        assert_eq!(ResourceKind::from_document_kind("agentgroup"), None);
        for kind in ALL {
            assert_eq!(
                nodus_core::resource::Kind::from_plural(kind.plural()).map(|k| k.to_string()),
                Some(kind.name().to_string()),
                "the server's table agrees"
            );
        }
    }

    #[test]
    fn targets_come_as_kind_slash_name_or_kind_then_names() {
        assert_eq!(
            parse_target("ag/parallel-agents").expect("valid"),
            (ResourceKind::AgentGroup, "parallel-agents".to_string())
        );
        assert!(parse_target("agentrun").is_err());
        assert!(parse_target("agentrun/").is_err());
        assert!(parse_target("agentrun/a/b").is_err());
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_targets(&args(&["ar"])).expect("valid"),
            (ResourceKind::AgentRun, vec![])
        );
        assert_eq!(
            parse_targets(&args(&["agentrun", "a", "b"])).expect("valid"),
            (
                ResourceKind::AgentRun,
                vec!["a".to_string(), "b".to_string()]
            )
        );
        assert_eq!(
            parse_targets(&args(&["ar/a", "agentrun/b"])).expect("valid"),
            (
                ResourceKind::AgentRun,
                vec!["a".to_string(), "b".to_string()]
            )
        );
        assert!(parse_targets(&args(&["ar/a", "ag/b"])).is_err());
        assert!(parse_targets(&args(&["ar", "ag/b"])).is_err());
        assert!(parse_targets(&[]).is_err());
    }
}
