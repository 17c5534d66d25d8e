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
    /// Encrypted key-value pairs, such as a BYOK agent's provider key.
    Secret,
    /// A cap on a project's total spend.
    Budget,
    /// Stored files that working directories are staged from.
    FileSet,
    /// A project's credit account: its credits, what it has spent and what is reserved
    /// (kept by the ledger in [`crate::ledger::SYSTEM_PROJECT`], named after the project).
    Account,
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
    /// The egress journal of a run whose sandbox had an allowlist (kept by the engine in
    /// [`crate::ledger::SYSTEM_PROJECT`], named after the run's uid): every connection its
    /// sandbox asked the egress proxy for ([`crate::egress_log`]).
    EgressLog,
    /// A kind nodus-core does not know, that an embedder keeps in the store for itself
    /// (the server's tokens): stored and listed under its name like any kind, never written
    /// through the engine nor served as a resource.
    #[serde(skip)]
    Extension(ExtensionKind),
}

/// The name of an [`Kind::Extension`] kind: its plural, 1 to [`ExtensionKind::MAX_LEN`]
/// lower-case ASCII letters, not a built-in kind's plural. Kept inline, so a `Kind` stays
/// `Copy` and needs no registry.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExtensionKind {
    len: u8,
    bytes: [u8; ExtensionKind::MAX_LEN],
}

impl ExtensionKind {
    /// The longest name.
    pub const MAX_LEN: usize = 24;

    /// The kind named `plural`, or `None` when it is not 1 to [`ExtensionKind::MAX_LEN`]
    /// lower-case ASCII letters or is a built-in kind's plural.
    pub const fn new(plural: &str) -> Option<ExtensionKind> {
        let name = plural.as_bytes();
        if name.is_empty() || name.len() > Self::MAX_LEN {
            return None;
        }
        let mut bytes = [0u8; Self::MAX_LEN];
        let mut i = 0;
        while i < name.len() {
            if !name[i].is_ascii_lowercase() {
                return None;
            }
            bytes[i] = name[i];
            i += 1;
        }
        let mut k = 0;
        while k < Kind::ALL.len() {
            if let Some(info) = Kind::ALL[k].info()
                && same(info.plural.as_bytes(), name)
            {
                return None;
            }
            k += 1;
        }
        // At most MAX_LEN (24): no truncation.
        let len = name.len() as u8;
        Some(ExtensionKind { len, bytes })
    }

    /// The name (the kind's plural).
    pub fn plural(&self) -> &str {
        // Only ASCII letters are ever stored.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

impl fmt::Debug for ExtensionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.plural())
    }
}

impl Kind {
    /// An extension kind, for a constant: `const TOKEN: Kind = Kind::extension("tokens");`
    /// (a name [`ExtensionKind::new`] refuses fails the build).
    pub const fn extension(plural: &str) -> Kind {
        match ExtensionKind::new(plural) {
            Some(kind) => Kind::Extension(kind),
            None => {
                panic!("an extension kind is 1 to 24 lower-case letters, not a built-in plural")
            }
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    #[cfg_attr(feature = "openapi", schemars(with = "Option<super::DateTime>"))]
    pub creation_timestamp: Option<Timestamp>,
}

/// The read-only project of ready-made agent templates (`claude-assistant`), which a run in
/// any project can name by its bare name.
pub const TEMPLATE_PROJECT: &str = "nodus";

/// A point in time as written in documents: RFC 3339 in UTC (`2026-05-01T12:00:00Z`).
#[cfg(feature = "openapi")]
pub struct DateTime;

#[cfg(feature = "openapi")]
impl schemars::JsonSchema for DateTime {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DateTime".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "format": "date-time"})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_read_back_and_extensions_stay_apart() {
        for kind in Kind::ALL {
            let plural = kind.plural();
            assert_eq!(Kind::stored(plural), Some(kind));
            assert!(!matches!(kind, Kind::Extension(_)), "{plural}");
            assert_eq!(ExtensionKind::new(plural), None, "{plural} is built in");
        }
        const TOKENS: Kind = Kind::extension("tokens");
        assert_eq!(TOKENS.plural(), "tokens");
        assert_eq!(TOKENS.to_string(), "tokens");
        assert_eq!(Kind::stored("tokens"), Some(TOKENS));
        assert_ne!(Kind::stored("projects"), Some(TOKENS));
        // Only plurals are stored; a user's short name is not a stored name.
        assert_eq!(Kind::stored("ar"), None);
        assert_eq!(
            Kind::named("tokens"),
            None,
            "the API serves no extension kind"
        );
        for bad in [
            "",
            "Tokens",
            "to-kens",
            "tokens1",
            "abcdefghijklmnopqrstuvwxy",
        ] {
            assert_eq!(ExtensionKind::new(bad), None, "{bad:?}");
        }
        assert!(ExtensionKind::new("abcdefghijklmnopqrstuvwx").is_some());
    }
}
