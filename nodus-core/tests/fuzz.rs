//! Property-based fuzzing of what users write, through the engine's own entry points:
//! documents of every kind (arbitrary JSON, arbitrary bytes, and valid documents with mutated
//! fields, so that the fuzzing reaches the rules behind the first parse error), JSON merge
//! patches (alone, and applied to live objects of every kind) and selectors' matching.
//!
//! No input panics; a refused document names the field and the rule; a refused patch writes
//! nothing; an accepted object reads back as a document that is accepted again.
//!
//! Every test's name starts with `fuzz_`. The test command runs proptest's default 256 cases
//! each; a long budget is `PROPTEST_CASES=1000 cargo test -p nodus-core --test fuzz`
//! (RELIABILITY.md, "Fuzzing").

use std::collections::BTreeMap;
use std::sync::Arc;

use nodus_core::engine::{Config, Deps, Engine, Error, WRITABLE_KINDS};
use nodus_core::patch::merge;
use nodus_core::resource::Kind;
use nodus_core::secret::{SealError, SecretString, Secrets};
use nodus_core::store::{MemoryStore, ObjectKey, Selector, Store};
use nodus_core::validate::Invalid;
use nodus_llm::ScriptedModel;
use nodus_sandbox::UnisolatedSandbox;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value, json};

const PROJECT: &str = "fuzz";

// ---------------------------------------------------------------------------------------
// An engine over the in-memory store, with one valid object of every kind.
// ---------------------------------------------------------------------------------------

/// A secret source that keeps Secret resources in the store as the server's does, "sealed"
/// as plain JSON (a test's values are no secrets): what the engine does with a Secret is under
/// test, not the sealing.
struct PlainSealing(Arc<dyn Store>);

#[async_trait::async_trait]
impl Secrets for PlainSealing {
    async fn lookup(&self, project: &str, name: &str, key: &str) -> Option<SecretString> {
        let record = self
            .0
            .get(&ObjectKey::new(project, Kind::Secret, name))
            .await
            .ok()?;
        let values = self.open(record.document["sealedData"].as_str()?).ok()?;
        values.get(key).cloned()
    }

    fn seal(&self, values: &BTreeMap<String, SecretString>) -> Result<String, SealError> {
        let plain: BTreeMap<&str, &str> = values
            .iter()
            .map(|(k, v)| (k.as_str(), v.expose()))
            .collect();
        serde_json::to_string(&plain).map_err(|e| SealError(e.to_string()))
    }

    fn open(&self, sealed: &str) -> Result<BTreeMap<String, SecretString>, SealError> {
        let plain: BTreeMap<String, String> =
            serde_json::from_str(sealed).map_err(|e| SealError(e.to_string()))?;
        Ok(plain
            .into_iter()
            .map(|(k, v)| (k, SecretString::new(v)))
            .collect())
    }
}

fn engine() -> Engine {
    let catalog = nodus_llm::offline_catalog(&nodus_llm::default_catalog().expect("catalog"));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let deps = Deps::builder(
        Arc::new(UnisolatedSandbox::new(
            std::env::temp_dir().join(format!("nodus-fuzz-{}", std::process::id())),
        )),
        Arc::new(ScriptedModel::offline()),
        catalog,
    )
    .store(store.clone())
    .secrets(Arc::new(PlainSealing(store)))
    .build();
    Engine::new(deps, Config::default())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn doc(kind: &str, name: &str, body: Value) -> Value {
    let mut document =
        json!({"apiVersion": "nodus.dev/v1", "kind": kind, "metadata": {"name": name}});
    if let (Value::Object(document), Value::Object(body)) = (&mut document, body) {
        document.extend(body);
    }
    document
}

/// One valid document of every kind users write, in the order they refer to each other.
fn valid_documents() -> Vec<(Kind, Value)> {
    vec![
        (
            Kind::Secret,
            doc(
                "Secret",
                "github",
                json!({"stringData": {"token": "t0ken"}}),
            ),
        ),
        (
            Kind::Secret,
            doc(
                "Secret",
                "anthropic-key",
                json!({"stringData": {"API_KEY": "sk-ant-x"}}),
            ),
        ),
        (
            Kind::Budget,
            doc("Budget", "it", json!({"spec": {"maxSpendUSD": "10.00"}})),
        ),
        (
            Kind::FileSet,
            doc(
                "FileSet",
                "project-source",
                json!({"spec": {"files": [
                    {"path": "app/config.yaml", "content": "retries: 3\n"},
                    {"path": "check.sh", "executable": true, "contentBase64": "IyEvYmluL3NoCg=="}
                ]}}),
            ),
        ),
        (
            Kind::AgentEnvironment,
            doc(
                "AgentEnvironment",
                "research",
                json!({"spec": {
                    "env": [
                        {"name": "LOG_LEVEL", "value": "debug"},
                        {"name": "GITHUB_TOKEN",
                         "valueFrom": {"secretKeyRef": {"name": "github", "key": "token"}}}
                    ],
                    "compute": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": 0}
                }}),
            ),
        ),
        (
            Kind::Environment,
            doc(
                "Environment",
                "arith",
                json!({"spec": {
                    "version": "1.0.0",
                    "grader": {"kind": "numeric", "tolerance": 0.5},
                    "splits": {
                        "test": {"tasks": [
                            {"id": "t1", "prompt": "2+2?", "hidden": {"expected": 4}},
                            {"id": "t2", "prompt": "3+3?", "hidden": {"expected": 6},
                             "files": {"fileSet": "project-source"}}
                        ]},
                        "train": {"tasks": [{"id": "t", "prompt": "1+1?", "hidden": {"expected": 2}}]}
                    }
                }}),
            ),
        ),
        (
            Kind::Agent,
            doc(
                "Agent",
                "hello-agent",
                json!({
                    "metadata": {"name": "hello-agent", "labels": {"team": "a", "app.kubernetes.io/name": "x"}},
                    "spec": {
                        "system": "You are a careful assistant.\n",
                        "model": {"access": "Nodus", "families": ["haiku", "sonnet"]},
                        "perRunMaxCostUSD": "0.50",
                        "maxTokens": 1024,
                        "maxToolCalls": 8,
                        "environment": "research"
                    }
                }),
            ),
        ),
        (
            Kind::Agent,
            doc(
                "Agent",
                "my-key-agent",
                json!({"spec": {
                    "system": "You are a careful assistant.",
                    "model": {"access": "BYOK", "name": "claude-sonnet-5-5", "apiKeySecret": "anthropic-key"}
                }}),
            ),
        ),
        (
            Kind::AgentGroup,
            doc(
                "AgentGroup",
                "parallel-agents",
                json!({"spec": {
                    "agent": "hello-agent",
                    "limits": {"maxActive": 2},
                    "maxCostUSD": "0.60"
                }}),
            ),
        ),
        (
            Kind::AgentGroup,
            doc(
                "AgentGroup",
                "eval",
                json!({"spec": {
                    "agent": "hello-agent",
                    "limits": {"maxActive": 2},
                    "maxCostUSD": "0.20",
                    "evaluation": {"environment": "arith@1.0.0", "split": "test", "tasks": 2,
                                   "repetitions": 1, "seed": 42, "timeout": "10m"}
                }}),
            ),
        ),
        (
            Kind::AgentRun,
            doc(
                "AgentRun",
                "hello-agent-run",
                json!({"spec": {
                    "agent": "hello-agent",
                    "input": "Print the Python version.",
                    "timeout": "5m",
                    "environment": "research",
                    "workdir": {
                        "baseWorkdir": "project-source",
                        "artifactMounts": [{"ref": "project-source#app/config.yaml", "mountPath": "copy/config.yaml"}]
                    }
                }}),
            ),
        ),
        (
            Kind::AgentRun,
            doc(
                "AgentRun",
                "parallel-agents-a",
                json!({"spec": {"agent": "hello-agent", "group": "parallel-agents", "taskKey": "a",
                                "input": "What is 1+1?"}}),
            ),
        ),
        (
            Kind::AgentRun,
            doc(
                "AgentRun",
                "parallel-agents-b",
                json!({"spec": {"agent": "hello-agent", "group": "parallel-agents", "taskKey": "b",
                                "input": "What is 2+2?"}}),
            ),
        ),
        (
            Kind::AgentRun,
            doc(
                "AgentRun",
                "parallel-agents-c",
                json!({"spec": {
                    "agent": "hello-agent",
                    "group": "parallel-agents",
                    "taskKey": "c",
                    "dependsOn": ["a", "b"],
                    "input": "What is the capital of France?"
                }}),
            ),
        ),
    ]
}

/// An engine holding every valid document.
async fn populated() -> Engine {
    let engine = engine();
    for (kind, document) in valid_documents() {
        engine
            .create_document(PROJECT, kind, document.clone())
            .await
            .unwrap_or_else(|e| panic!("the valid {kind:?} {document} is refused: {e}"));
    }
    engine
}

/// What a refusal must say: a field (or the document as a whole) and a rule.
fn check_refusal(error: &Error) -> Result<(), TestCaseError> {
    if let Error::Invalid(Invalid { rule, value, .. }) = error {
        prop_assert!(!rule.is_empty(), "no rule in {error}");
        prop_assert!(
            error.to_string().len() < 2000,
            "an error of {} bytes: {error}",
            error.to_string().len()
        );
        prop_assert!(value.len() < 1000, "the value is not shortened: {error}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Generators.
// ---------------------------------------------------------------------------------------

/// Strings that break rules: empty, blank, long, control characters, path tricks, numbers
/// and money written oddly, names of kinds and fields.
fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "", " ", "a", "-", "..", "../x", "/abs", "a/b", "a b", "A", "a.b", "a@1.0.0", "x@",
            "0", "-1", "1e999", "0.000000001", "0.0000000001", "99999999999999999999.99",
            "1.5", "NaN", "inf", "-0", "10m", "0s", "25h", "1d", "2Gi", "500m", "0.5", "1e3",
            "Nodus", "BYOK", "Stopped", "haiku", "sonnet", "opus", "exact", "numeric", "regex",
            "command", "(", "[a-", "\\", "\u{0}", "\n", "é", "ß", "𝄞", "project-source#",
            "#x", "project-source#../etc/passwd", "arith@2.0.0", "hello-agent", "research",
            "github", "parallel-agents", "agents.webhook", "http://u:p@h/", "nodus.dev/v1",
        ])
        .prop_map(str::to_string),
        3 => "\\PC{0,24}",
        1 => ".{0,12}",
        1 => (1usize..70_000).prop_map(|n| "a".repeat(n)),
    ]
}

fn tricky_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(2),
            json!(1000),
            json!(1001),
            json!(128_000),
            json!(128_001),
            json!(u32::MAX),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(0.5),
            json!(-0.0),
            json!(1e308),
            json!(-1e308),
            json!(f64::EPSILON),
        ]),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
    ]
}

/// Field names of the kinds' documents, so that generated objects hit real fields.
const FIELD_NAMES: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "labels",
    "annotations",
    "resourceVersion",
    "uid",
    "spec",
    "status",
    "system",
    "model",
    "access",
    "families",
    "apiKeySecret",
    "perRunMaxCostUSD",
    "maxTokens",
    "maxToolCalls",
    "environment",
    "contextSchema",
    "agent",
    "input",
    "group",
    "taskKey",
    "dependsOn",
    "timeout",
    "workdir",
    "baseWorkdir",
    "artifactMounts",
    "ref",
    "mountPath",
    "limits",
    "maxActive",
    "maxCostUSD",
    "evaluation",
    "split",
    "tasks",
    "repetitions",
    "seed",
    "files",
    "path",
    "content",
    "contentBase64",
    "executable",
    "env",
    "value",
    "valueFrom",
    "secretKeyRef",
    "key",
    "compute",
    "cpu",
    "memory",
    "nvidia.com/gpu",
    "stringData",
    "data",
    "maxSpendUSD",
    "version",
    "grader",
    "tolerance",
    "splits",
    "id",
    "prompt",
    "hidden",
    "expected",
    "pattern",
    "postRunAction",
    "postRunActions",
    "config",
    "state",
];

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(FIELD_NAMES).prop_map(str::to_string),
        1 => "\\PC{0,10}",
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        tricky_number(),
        tricky_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(field_name(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// A change to a document: at the place an index picks among its values (objects and
/// arrays included), or in the object an index picks.
#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the value.
    Set(Index, Value),
    /// Remove the value from its object or array.
    Remove(Index),
    /// Add a member (a known field name or another) to an object.
    Add(Index, String, Value),
    /// Put the value inside an array, or wrap it in one.
    Wrap(Index),
    /// Repeat an array's element (duplicates).
    Duplicate(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), any_json()).prop_map(|(at, v)| Mutation::Set(at, v)),
        2 => any::<Index>().prop_map(Mutation::Remove),
        2 => (any::<Index>(), field_name(), any_json()).prop_map(|(at, k, v)| Mutation::Add(at, k, v)),
        1 => any::<Index>().prop_map(Mutation::Wrap),
        1 => any::<Index>().prop_map(Mutation::Duplicate),
    ]
}

/// The JSON pointers of every value in `value`, the root first.
fn pointers(value: &Value) -> Vec<String> {
    fn walk(value: &Value, at: String, out: &mut Vec<String>) {
        out.push(at.clone());
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let key = key.replace('~', "~0").replace('/', "~1");
                    walk(child, format!("{at}/{key}"), out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(child, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, String::new(), &mut out);
    out
}

fn parent_and_last(pointer: &str) -> Option<(&str, String)> {
    let (parent, last) = pointer.rsplit_once('/')?;
    Some((parent, last.replace("~1", "/").replace("~0", "~")))
}

fn mutate(document: &mut Value, mutation: &Mutation) {
    let all = pointers(document);
    match mutation {
        Mutation::Set(at, value) => {
            if let Some(place) = document.pointer_mut(all[at.index(all.len())].as_str()) {
                *place = value.clone();
            }
        }
        Mutation::Remove(at) => {
            let Some((parent, last)) = parent_and_last(all[at.index(all.len())].as_str()) else {
                return;
            };
            match document.pointer_mut(parent) {
                Some(Value::Object(map)) => {
                    map.remove(&last);
                }
                Some(Value::Array(items)) => {
                    if let Ok(i) = last.parse::<usize>()
                        && i < items.len()
                    {
                        items.remove(i);
                    }
                }
                _ => {}
            }
        }
        Mutation::Add(at, key, value) => {
            let objects: Vec<&String> = all
                .iter()
                .filter(|p| document.pointer(p).is_some_and(Value::is_object))
                .collect();
            if objects.is_empty() {
                return;
            }
            let pointer = at.get(&objects).to_string();
            if let Some(Value::Object(map)) = document.pointer_mut(&pointer) {
                map.insert(key.clone(), value.clone());
            }
        }
        Mutation::Wrap(at) => {
            if let Some(place) = document.pointer_mut(all[at.index(all.len())].as_str()) {
                *place = Value::Array(vec![place.take()]);
            }
        }
        Mutation::Duplicate(at) => {
            let arrays: Vec<&String> = all
                .iter()
                .filter(|p| document.pointer(p).is_some_and(Value::is_array))
                .collect();
            if arrays.is_empty() {
                return;
            }
            let pointer = at.get(&arrays).to_string();
            if let Some(Value::Array(items)) = document.pointer_mut(&pointer)
                && let Some(first) = items.first().cloned()
            {
                items.push(first);
            }
        }
    }
}

/// A valid document of some kind with a few mutations.
fn mutated_document() -> impl Strategy<Value = (Kind, Value)> {
    (any::<Index>(), prop::collection::vec(mutation(), 1..4)).prop_map(|(which, mutations)| {
        let (kind, mut document) = which.get(&valid_documents()).clone();
        for mutation in &mutations {
            mutate(&mut document, mutation);
        }
        (kind, document)
    })
}

// ---------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------

/// Creating `document` as `kind`: refused with a field and a rule, or created, in which case
/// the object as reading shows it is taken back by `apply` unchanged.
async fn create_checked(engine: &Engine, kind: Kind, document: Value) -> Result<(), TestCaseError> {
    match engine.create_document(PROJECT, kind, document).await {
        Err(error) => check_refusal(&error),
        Ok(shown) => {
            if kind == Kind::Secret {
                return check_secret_shown(&shown);
            }
            let again = engine.apply_document(PROJECT, kind, shown.clone()).await;
            let again = again.map_err(|e| {
                TestCaseError::fail(format!(
                    "the created {kind:?} {shown} is refused when applied back: {e}"
                ))
            })?;
            prop_assert_eq!(
                strip_versions(again),
                strip_versions(shown),
                "applying a created object back changed it"
            );
            Ok(())
        }
    }
}

/// A Secret as reading shows it: its keys, never its values, sealed or not (so it is not
/// applied back: it holds nothing to apply).
fn check_secret_shown(shown: &Value) -> Result<(), TestCaseError> {
    for hidden in ["stringData", "data", "sealedData"] {
        prop_assert!(
            shown.get(hidden).is_none(),
            "a Secret shows {hidden}: {shown}"
        );
    }
    Ok(())
}

/// A document without what every write changes (its version and when it changed).
fn strip_versions(mut document: Value) -> Value {
    if let Some(Value::Object(meta)) = document.get_mut("metadata") {
        meta.remove("resourceVersion");
        meta.remove("generation");
        meta.remove("updatedAt");
    }
    document
}

proptest! {
    /// Arbitrary JSON as a document of every kind.
    #[test]
    fn fuzz_arbitrary_json_documents_of_every_kind(document in any_json()) {
        runtime().block_on(async {
            let engine = engine();
            for kind in WRITABLE_KINDS {
                create_checked(&engine, kind, document.clone()).await?;
            }
            Ok::<_, TestCaseError>(())
        })?;
    }

    /// Arbitrary bytes, read as JSON the way the server reads a body, then as every kind.
    #[test]
    fn fuzz_arbitrary_bytes_as_documents(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(document) = serde_json::from_slice::<Value>(&bytes) {
            runtime().block_on(async {
                let engine = engine();
                for kind in WRITABLE_KINDS {
                    create_checked(&engine, kind, document.clone()).await?;
                }
                Ok::<_, TestCaseError>(())
            })?;
        }
    }

    /// Valid documents of every kind with mutated fields, created where every object they
    /// may refer to exists.
    #[test]
    fn fuzz_mutated_documents_of_every_kind(
        (kind, document) in mutated_document(),
        rename in any::<bool>(),
    ) {
        runtime().block_on(async {
            let engine = populated().await;
            let mut document = document;
            if rename && let Some(meta) = document.get_mut("metadata").and_then(Value::as_object_mut) {
                // A new name, so that the write is a creation rather than a conflict.
                meta.insert("name".into(), json!("fuzzed"));
            }
            create_checked(&engine, kind, document).await
        })?;
    }

    /// RFC 7396 on arbitrary values: applying a patch twice is applying it once, a `null`
    /// member removes the key, and a patch that is not an object replaces the target.
    #[test]
    fn fuzz_merge_patch_laws(target in any_json(), patch in any_json()) {
        let mut once = target.clone();
        merge(&mut once, &patch);
        let mut twice = once.clone();
        merge(&mut twice, &patch);
        prop_assert_eq!(&twice, &once);
        match &patch {
            Value::Object(members) => {
                let result = once.as_object().expect("an object patch gives an object");
                for (key, value) in members {
                    if value.is_null() {
                        prop_assert!(!result.contains_key(key), "{key} kept");
                    } else {
                        prop_assert!(result.contains_key(key), "{key} missing");
                    }
                }
                if let Value::Object(before) = &target {
                    for (key, value) in before {
                        if !members.contains_key(key) {
                            prop_assert_eq!(result.get(key), Some(value), "{} changed", key);
                        }
                    }
                }
            }
            other => prop_assert_eq!(&once, other),
        }
    }

    /// Merge patches of live objects of every kind: arbitrary patches, and patches that set,
    /// remove or add a field of the object's own spec. A refused patch leaves the object as
    /// it was; an accepted one leaves an object that reads back and is accepted again.
    #[test]
    fn fuzz_merge_patches_of_live_objects(
        which in any::<Index>(),
        patch in prop_oneof![
            any_json(),
            (any::<Index>(), prop::collection::vec(mutation(), 1..3)).prop_map(|(which, mutations)| {
                let (_, mut document) = which.get(&valid_documents()).clone();
                for mutation in &mutations {
                    mutate(&mut document, mutation);
                }
                let mut patch = Map::new();
                for part in ["spec", "metadata", "stringData", "data"] {
                    if let Some(value) = document.get(part) {
                        patch.insert(part.into(), value.clone());
                    }
                }
                Value::Object(patch)
            }),
            (field_name(), field_name(), any_json()).prop_map(|(a, b, v)| json!({"spec": {a: {b: v}}})),
            (field_name(), any_json()).prop_map(|(a, v)| json!({"spec": {a: v}})),
            (field_name(), prop_oneof![Just(Value::Null), any_json()]).prop_map(|(a, v)| json!({"metadata": {a: v}})),
        ],
    ) {
        runtime().block_on(async {
            let engine = populated().await;
            let documents = valid_documents();
            let (kind, document) = which.get(&documents);
            let name = match kind {
                Kind::Environment => format!(
                    "{}@{}",
                    document["metadata"]["name"].as_str().unwrap_or_default(),
                    document["spec"]["version"].as_str().unwrap_or_default()
                ),
                _ => document["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            };
            let before = engine.get_document(PROJECT, *kind, &name).await.expect("created");
            match engine.patch_document(PROJECT, *kind, &name, &patch).await {
                Err(error) => {
                    check_refusal(&error)?;
                    let after = engine.get_document(PROJECT, *kind, &name).await.expect("still there");
                    prop_assert_eq!(after, before, "a refused patch ({}) changed the object", error);
                }
                Ok(shown) if *kind == Kind::Secret => check_secret_shown(&shown)?,
                Ok(shown) => {
                    let again = engine.apply_document(PROJECT, *kind, shown.clone()).await.map_err(|e| {
                        TestCaseError::fail(format!("the patched {kind:?} {shown} is refused when applied back: {e}"))
                    })?;
                    prop_assert_eq!(strip_versions(again), strip_versions(shown));
                }
            }
            Ok(())
        })?;
    }

    /// Selectors on arbitrary documents: no panic; a document matches a selector made of its
    /// own labels and string fields, and no longer matches when one selected value differs.
    #[test]
    fn fuzz_selector_matching(
        document in any_json(),
        labels in prop::collection::btree_map("[a-z./]{1,8}", "\\PC{0,8}", 0..4),
        fields in prop::collection::btree_map(
            prop::sample::select(vec!["spec.agent", "spec.group", "status.phase", "metadata.name", "a.b.c"]),
            "\\PC{0,8}",
            0..3,
        ),
        other in "\\PC{0,8}",
    ) {
        let arbitrary = Selector {
            labels: labels.clone(),
            fields: fields.iter().map(|(k, v)| ((*k).to_string(), v.clone())).collect(),
        };
        let _ = arbitrary.matches(&document);
        let _ = Selector::default().matches(&document);

        let mut built = json!({"metadata": {"labels": labels}});
        for (path, value) in &fields {
            let mut place = &mut built;
            for part in path.split('.') {
                place = &mut place[part];
            }
            *place = json!(value);
        }
        prop_assert!(arbitrary.matches(&built), "{:?} does not match {}", arbitrary, built);
        prop_assert!(Selector::default().matches(&built));
        let changed: Vec<Selector> = arbitrary
            .labels
            .keys()
            .map(|k| {
                let mut s = arbitrary.clone();
                s.labels.insert(k.clone(), format!("{}{other}x", s.labels[k]));
                s
            })
            .chain(arbitrary.fields.keys().map(|k| {
                let mut s = arbitrary.clone();
                s.fields.insert(k.clone(), format!("{}{other}x", s.fields[k]));
                s
            }))
            .collect();
        for selector in changed {
            prop_assert!(!selector.matches(&built), "{:?} matches {}", selector, built);
        }
    }
}
