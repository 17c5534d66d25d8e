//! Object metadata and the kinds of resource Nodus knows.

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The one API version of this release.
pub const API_VERSION: &str = "nodus.dev/v1";

/// The kinds of resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum Kind {
    /// A definition: system prompt, model access, cost cap.
    Agent,
    /// One conversation with an agent.
    AgentRun,
    /// Many runs of one agent under shared limits.
    AgentGroup,
    /// Encrypted key-value pairs, such as a BYOK agent's `ANTHROPIC_API_KEY`.
    Secret,
    /// A cap on a project's total spend.
    Budget,
    /// Stored files that working directories are staged from.
    FileSet,
    /// A project: its credits and what it has spent (kept by the server).
    Project,
    /// An API token and the projects it holds (kept by the server, by hash).
    Token,
    /// The runs a batch created under an idempotency key (kept by the engine).
    BatchRecord,
    /// A run's private document (kept by the engine, named after the run): its staged and
    /// final working directories, as tar archives, and the Secret values it was created with,
    /// sealed.
    WorkdirArchive,
    /// Environment variables (plain or from Secrets) and compute for runs' sandboxes.
    AgentEnvironment,
    /// A versioned set of evaluation tasks and their grader (stored as `name@version`).
    Environment,
    /// One case of an evaluation group and its one terminal state (kept by the engine, named
    /// after the case's run).
    EvaluationCase,
}

impl Kind {
    /// The lower-case plural used in REST paths (`agentruns`).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Agent => "agents",
            Kind::AgentRun => "agentruns",
            Kind::AgentGroup => "agentgroups",
            Kind::Secret => "secrets",
            Kind::Budget => "budgets",
            Kind::FileSet => "filesets",
            Kind::Project => "projects",
            Kind::Token => "tokens",
            Kind::BatchRecord => "batchrecords",
            Kind::WorkdirArchive => "workdirarchives",
            Kind::AgentEnvironment => "agentenvironments",
            Kind::Environment => "environments",
            Kind::EvaluationCase => "evaluationcases",
        }
    }

    /// The kind whose plural (or, for the kinds users write, kubectl-style singular or short
    /// name) this is. Every kind's [`Kind::plural`] reads back.
    pub fn from_plural(plural: &str) -> Option<Kind> {
        Some(match plural {
            "agents" | "agent" => Kind::Agent,
            "agentruns" | "agentrun" | "ar" => Kind::AgentRun,
            "agentgroups" | "agentgroup" | "ag" => Kind::AgentGroup,
            "secrets" | "secret" => Kind::Secret,
            "budgets" | "budget" => Kind::Budget,
            "filesets" | "fileset" | "fs" => Kind::FileSet,
            "projects" => Kind::Project,
            "tokens" => Kind::Token,
            "batchrecords" => Kind::BatchRecord,
            "workdirarchives" => Kind::WorkdirArchive,
            "agentenvironments" | "agentenvironment" | "ae" => Kind::AgentEnvironment,
            "environments" | "environment" | "env" => Kind::Environment,
            "evaluationcases" => Kind::EvaluationCase,
            _ => return None,
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Agent => "Agent",
            Kind::AgentRun => "AgentRun",
            Kind::AgentGroup => "AgentGroup",
            Kind::Secret => "Secret",
            Kind::Budget => "Budget",
            Kind::FileSet => "FileSet",
            Kind::Project => "Project",
            Kind::Token => "Token",
            Kind::BatchRecord => "BatchRecord",
            Kind::WorkdirArchive => "WorkdirArchive",
            Kind::AgentEnvironment => "AgentEnvironment",
            Kind::Environment => "Environment",
            Kind::EvaluationCase => "EvaluationCase",
        })
    }
}

/// `metadata`: the user's name and labels, and the fields the store assigns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    /// A DNS-1123 label; optional only for group tasks, whose name is `<group>-<taskKey>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The project the object lives in (assigned from the request path when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Labels for selection with `-l`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Free-form annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Unique id assigned at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Version for optimistic concurrency; a write naming a stale version is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// When the object was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(with = "Option<crate::schema::DateTime>")
    )]
    pub creation_timestamp: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plural_reads_back() {
        for kind in [
            Kind::Agent,
            Kind::AgentRun,
            Kind::AgentGroup,
            Kind::Secret,
            Kind::Budget,
            Kind::FileSet,
            Kind::Project,
            Kind::Token,
            Kind::BatchRecord,
            Kind::WorkdirArchive,
            Kind::AgentEnvironment,
            Kind::Environment,
            Kind::EvaluationCase,
        ] {
            assert_eq!(Kind::from_plural(kind.plural()), Some(kind), "{kind}");
        }
        assert_eq!(Kind::from_plural("ar"), Some(Kind::AgentRun));
        assert_eq!(Kind::from_plural("nothing"), None);
    }
}
