//! The kind registry: what every part of Nodus knows of a built-in kind — the `kind` its
//! documents name, its plural (REST path segment and stored name), its short name, who writes
//! it, where it is kept and its place in an apply — written once, as one table
//! ([`Kind::info`]). The engine's writable kinds, the API's paths and the CLI's kinds are read
//! from it.

use super::Kind;

/// Who writes the objects of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrittenBy {
    /// Users, through the engine's verbs ([`crate::engine::Writable`]), the API and the CLI.
    Users {
        /// Its place in an apply of several documents: a kind is written after every kind of
        /// a lower rank (the kinds it refers to), kinds of one rank in the order given; a
        /// delete of several goes the other way.
        apply_rank: u8,
    },
    /// Nodus itself (the engine, the ledger): never written nor served as a resource.
    Nodus,
}

/// Where the objects of a kind are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeptIn {
    /// In the project they belong to.
    Project,
    /// In the system project ([`crate::ledger::SYSTEM_PROJECT`]), whatever project they
    /// concern.
    System,
}

/// What Nodus knows of a built-in kind: one row of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KindInfo {
    /// The `kind` its documents name (`AgentRun`).
    pub name: &'static str,
    /// Its plural: the segment of its REST paths (`…/projects/{project}/agentruns`) and the
    /// name stores keep it under.
    pub plural: &'static str,
    /// The short name that the command line and the API's paths take besides its plural and
    /// lower-case singular (`ar`), if it has one.
    pub short_name: Option<&'static str>,
    /// Who writes it.
    pub written_by: WrittenBy,
    /// Where it is kept.
    pub kept_in: KeptIn,
}

/// A row of a kind users write, kept in its project.
const fn users(
    name: &'static str,
    plural: &'static str,
    short_name: Option<&'static str>,
    apply_rank: u8,
) -> KindInfo {
    KindInfo {
        name,
        plural,
        short_name,
        written_by: WrittenBy::Users { apply_rank },
        kept_in: KeptIn::Project,
    }
}

/// A row of a kind Nodus keeps for itself.
const fn kept(name: &'static str, plural: &'static str, kept_in: KeptIn) -> KindInfo {
    KindInfo {
        name,
        plural,
        short_name: None,
        written_by: WrittenBy::Nodus,
        kept_in,
    }
}

impl Kind {
    /// Every built-in kind, in the order the kinds are declared (lists of the kinds users
    /// write follow it: help texts, errors).
    pub const ALL: [Kind; 13] = [
        Kind::Agent,
        Kind::AgentRun,
        Kind::AgentGroup,
        Kind::Secret,
        Kind::Budget,
        Kind::FileSet,
        Kind::Account,
        Kind::BatchRecord,
        Kind::WorkdirArchive,
        Kind::AgentEnvironment,
        Kind::Environment,
        Kind::EvaluationCase,
        Kind::EgressLog,
    ];

    /// The kinds users write (the engine's [`crate::engine::Writable`] kinds, the ones the
    /// API serves), in the order of [`Kind::ALL`].
    pub const WRITABLE: [Kind; writable_count()] = writable();

    /// The registry: what Nodus knows of a built-in kind; `None` for an extension kind, which
    /// its embedder describes.
    ///
    /// An apply's ranks put what a kind refers to first: Secrets and Budgets; FileSets and
    /// AgentEnvironments (which read Secrets); Agents (naming an AgentEnvironment) and
    /// Environments (naming FileSets); groups (naming an Agent or an Environment); runs
    /// (naming all of these and their group).
    pub const fn info(&self) -> Option<KindInfo> {
        Some(match self {
            Kind::Agent => users("Agent", "agents", None, 2),
            Kind::AgentRun => users("AgentRun", "agentruns", Some("ar"), 4),
            Kind::AgentGroup => users("AgentGroup", "agentgroups", Some("ag"), 3),
            Kind::Secret => users("Secret", "secrets", None, 0),
            Kind::Budget => users("Budget", "budgets", None, 0),
            Kind::FileSet => users("FileSet", "filesets", Some("fs"), 1),
            Kind::Account => kept("Account", "accounts", KeptIn::System),
            Kind::BatchRecord => kept("BatchRecord", "batchrecords", KeptIn::Project),
            Kind::WorkdirArchive => kept("WorkdirArchive", "workdirarchives", KeptIn::Project),
            Kind::AgentEnvironment => users("AgentEnvironment", "agentenvironments", Some("ae"), 1),
            Kind::Environment => users("Environment", "environments", Some("env"), 2),
            Kind::EvaluationCase => kept("EvaluationCase", "evaluationcases", KeptIn::Project),
            Kind::EgressLog => kept("EgressLog", "egresslogs", KeptIn::System),
            Kind::Extension(_) => return None,
        })
    }

    /// The `kind` its documents name (`AgentRun`); an extension kind's plural.
    pub fn name(&self) -> &str {
        match (self, self.info()) {
            (Kind::Extension(kind), _) => kind.plural(),
            (_, info) => info.map_or("", |info| info.name),
        }
    }

    /// The lower-case plural used in REST paths (`agentruns`) and in the stores.
    pub fn plural(&self) -> &str {
        match (self, self.info()) {
            (Kind::Extension(kind), _) => kind.plural(),
            (_, info) => info.map_or("", |info| info.plural),
        }
    }

    /// The lower-case singular (`agentrun`), as kubectl names a kind.
    pub fn singular(&self) -> String {
        self.name().to_ascii_lowercase()
    }

    /// The short name (`ar`), if the kind has one.
    pub fn short_name(&self) -> Option<&'static str> {
        self.info().and_then(|info| info.short_name)
    }

    /// Whether users write objects of this kind (it is one of [`Kind::WRITABLE`]).
    pub const fn is_writable(&self) -> bool {
        matches!(
            self.info(),
            Some(KindInfo {
                written_by: WrittenBy::Users { .. },
                ..
            })
        )
    }

    /// Where an apply of several documents puts this kind (see [`WrittenBy::Users`]); `None`
    /// for a kind users do not write.
    pub fn apply_rank(&self) -> Option<u8> {
        match self.info()?.written_by {
            WrittenBy::Users { apply_rank } => Some(apply_rank),
            WrittenBy::Nodus => None,
        }
    }

    /// Where its objects are kept; `None` for an extension kind (its embedder decides).
    pub fn kept_in(&self) -> Option<KeptIn> {
        self.info().map(|info| info.kept_in)
    }

    /// The kind users write that `text` names as the API's paths and the command line do: its
    /// plural, its lower-case singular or its short name (`agentruns`, `agentrun`, `ar`).
    pub fn named(text: &str) -> Option<Kind> {
        Kind::WRITABLE.into_iter().find(|kind| {
            text == kind.plural() || text == kind.singular() || kind.short_name() == Some(text)
        })
    }

    /// The kind users write whose documents name `name` (`AgentRun`), exactly.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::WRITABLE.into_iter().find(|kind| kind.name() == name)
    }

    /// The kind stored under `plural`: a built-in kind's plural (only the plural), or else
    /// an extension kind's name; `None` when it is neither. Stores read kinds back with it.
    pub fn stored(plural: &str) -> Option<Kind> {
        if let Some(kind) = Kind::ALL.into_iter().find(|kind| kind.plural() == plural) {
            return Some(kind);
        }
        // A user's singular or short name of a built-in kind is not a stored name.
        if Kind::named(plural).is_some() {
            return None;
        }
        super::meta::ExtensionKind::new(plural).map(Kind::Extension)
    }
}

/// How many kinds users write.
const fn writable_count() -> usize {
    let mut count = 0;
    let mut index = 0;
    while index < Kind::ALL.len() {
        if Kind::ALL[index].is_writable() {
            count += 1;
        }
        index += 1;
    }
    count
}

/// The kinds users write, in the order of [`Kind::ALL`].
const fn writable<const N: usize>() -> [Kind; N] {
    let mut kinds = [Kind::Agent; N];
    let mut count = 0;
    let mut index = 0;
    while index < Kind::ALL.len() {
        if Kind::ALL[index].is_writable() {
            kinds[count] = Kind::ALL[index];
            count += 1;
        }
        index += 1;
    }
    kinds
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The index of each kind's variant: a kind added to [`Kind`] fails to compile here until
    /// it is given a place, and then the test below fails until [`Kind::ALL`] lists it.
    fn variant(kind: Kind) -> usize {
        match kind {
            Kind::Agent => 0,
            Kind::AgentRun => 1,
            Kind::AgentGroup => 2,
            Kind::Secret => 3,
            Kind::Budget => 4,
            Kind::FileSet => 5,
            Kind::Account => 6,
            Kind::BatchRecord => 7,
            Kind::WorkdirArchive => 8,
            Kind::AgentEnvironment => 9,
            Kind::Environment => 10,
            Kind::EvaluationCase => 11,
            Kind::EgressLog => 12,
            Kind::Extension(_) => usize::MAX,
        }
    }

    #[test]
    fn every_kind_appears_once_with_names_of_its_own() {
        let listed: Vec<usize> = Kind::ALL.into_iter().map(variant).collect();
        assert_eq!(listed, (0..13).collect::<Vec<_>>(), "each variant once");
        let mut names = BTreeSet::new();
        for kind in Kind::ALL {
            let info = kind.info().expect("a built-in kind");
            assert_eq!(kind.to_string(), info.name);
            assert_eq!(kind.plural(), info.plural);
            assert_eq!(Kind::stored(kind.plural()), Some(kind), "{kind}");
            for name in [Some(info.plural), info.short_name, Some(&*kind.singular())]
                .into_iter()
                .flatten()
            {
                assert!(names.insert(name.to_string()), "{name} names one kind");
            }
            assert_eq!(kind.is_writable(), Kind::WRITABLE.contains(&kind), "{kind}");
            assert_eq!(kind.apply_rank().is_some(), kind.is_writable(), "{kind}");
        }
    }

    /// The names users see, exactly as the spec, the CLI, the API and the SDK spell them.
    #[test]
    fn the_kinds_users_write_keep_their_names_and_order() {
        let rows: Vec<(&str, &str, Option<&str>, u8)> = Kind::WRITABLE
            .iter()
            .map(|kind| {
                (
                    kind.name(),
                    kind.plural(),
                    kind.short_name(),
                    kind.apply_rank().expect("written"),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("Agent", "agents", None, 2),
                ("AgentRun", "agentruns", Some("ar"), 4),
                ("AgentGroup", "agentgroups", Some("ag"), 3),
                ("Secret", "secrets", None, 0),
                ("Budget", "budgets", None, 0),
                ("FileSet", "filesets", Some("fs"), 1),
                ("AgentEnvironment", "agentenvironments", Some("ae"), 1),
                ("Environment", "environments", Some("env"), 2),
            ]
        );
        for kind in Kind::ALL {
            assert_eq!(
                kind.kept_in() == Some(KeptIn::System),
                matches!(kind, Kind::Account | Kind::EgressLog),
                "{kind}"
            );
        }
    }

    #[test]
    fn users_name_kinds_by_plural_singular_or_short_name() {
        let cases = [
            ("agents", Some(Kind::Agent)),
            ("agent", Some(Kind::Agent)),
            ("agentruns", Some(Kind::AgentRun)),
            ("agentrun", Some(Kind::AgentRun)),
            ("ar", Some(Kind::AgentRun)),
            ("ag", Some(Kind::AgentGroup)),
            ("fs", Some(Kind::FileSet)),
            ("ae", Some(Kind::AgentEnvironment)),
            ("env", Some(Kind::Environment)),
            ("environment", Some(Kind::Environment)),
            ("secret", Some(Kind::Secret)),
            ("budgets", Some(Kind::Budget)),
            // Kinds Nodus keeps are not named by users; names are lower case.
            ("accounts", None),
            ("egresslogs", None),
            ("AgentRun", None),
            ("tokens", None),
            ("nothing", None),
        ];
        for (text, kind) in cases {
            assert_eq!(Kind::named(text), kind, "{text}");
        }
        assert_eq!(Kind::from_name("AgentGroup"), Some(Kind::AgentGroup));
        assert_eq!(Kind::from_name("agentgroup"), None);
        assert_eq!(Kind::from_name("Account"), None, "not a kind users write");
    }
}
