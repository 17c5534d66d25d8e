//! The OpenAPI 3.1 document served at `/openapi.json`: every route of [`crate::api::routes`]
//! with its parameters, bodies and answers, and every body's schema derived from the Rust
//! types that read or write it (schemars, `nodus-core`'s `openapi` feature).

use nodus_core::engine::{Reason, RunResultInfo, StepView};
use nodus_core::evaluation::CaseResult;
use nodus_core::evaluation::retry::RetryRequest;
use nodus_core::ledger::Account;
use nodus_core::postrun::ActionInfo;
use nodus_core::resource::{
    API_VERSION, AgentEnvironmentSpec, AgentGroupSpec, AgentRunSpec, AgentSpec, BudgetSpec,
    EnvironmentSpec, FileSetSpec, Kind, ObjectMeta, Spec,
};
use nodus_core::validate::Invalid;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use crate::api::credits::AddCredits;
use crate::api::runs::{ForkBody, MessageBody, RescoreBody, ResolveBody};

/// Where every named schema lives.
const SCHEMAS: &str = "#/components/schemas/";

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("{SCHEMAS}{name}")})
}

/// The document of one kind written as an [`nodus_core::resource::Object`]: `apiVersion`,
/// `kind`, `metadata`, `spec`, `status`, the same when written and when read.
fn object_schema<S: Spec + JsonSchema>(generator: &mut SchemaGenerator) -> Value
where
    S::Status: JsonSchema,
{
    json!({
        "type": "object",
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"const": S::KIND.to_string()},
            "metadata": generator.subschema_for::<ObjectMeta>(),
            "spec": generator.subschema_for::<S>(),
            "status": generator.subschema_for::<S::Status>(),
        },
        "required": ["apiVersion", "kind", "spec"],
        "additionalProperties": false,
    })
}

/// The named schemas: each kind as written and as read, lists, the other bodies, errors.
fn schemas() -> Map<String, Value> {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|settings| {
            settings.definitions_path = "/components/schemas".into();
            settings.meta_schema = None;
        })
        .into_generator();
    let mut named = Map::new();
    for (kind, schema) in [
        (Kind::Agent, object_schema::<AgentSpec>(&mut generator)),
        (
            Kind::AgentRun,
            object_schema::<AgentRunSpec>(&mut generator),
        ),
        (
            Kind::AgentGroup,
            object_schema::<AgentGroupSpec>(&mut generator),
        ),
        (Kind::Budget, object_schema::<BudgetSpec>(&mut generator)),
        (Kind::FileSet, object_schema::<FileSetSpec>(&mut generator)),
        (
            Kind::AgentEnvironment,
            object_schema::<AgentEnvironmentSpec>(&mut generator),
        ),
        (
            Kind::Environment,
            object_schema::<EnvironmentSpec>(&mut generator),
        ),
    ] {
        named.insert(kind.to_string(), schema);
    }
    named.insert(
        "Secret".into(),
        nodus_core::schema::secret_read_schema(&mut generator).to_value(),
    );
    named.insert(
        "SecretWrite".into(),
        nodus_core::schema::secret_write_schema(&mut generator).to_value(),
    );
    for kind in Kind::WRITABLE {
        named.insert(format!("{kind}List"), json!({
            "type": "object",
            "properties": {
                "apiVersion": {"const": API_VERSION},
                "kind": {"const": format!("{kind}List")},
                "metadata": {"type": "object", "properties": {"resourceVersion": {"type": "string", "description": "a digest of the items' versions, for watch=true"}, "continue": {"type": "string", "description": "with limit: present only when more objects remain; pass it as continue= to get the next ones (opaque; it holds for the same project, kind and selectors only)"}}, "required": ["resourceVersion"], "additionalProperties": false},
                "items": {"type": "array", "items": schema_ref(&kind.to_string())},
            },
            "required": ["apiVersion", "kind", "items"],
            "additionalProperties": false,
        }));
    }
    named.insert("WatchEvent".into(), json!({
        "description": "One line of a watch stream: what happened to an object, and the object (for ERROR, a Status; for BOOKMARK, only its metadata.resourceVersion)",
        "type": "object",
        "properties": {
            "type": {"enum": ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]},
            "object": {"type": "object"},
        },
        "required": ["type", "object"],
    }));
    named.insert("LogLine".into(), json!({
        "description": "One line of a run's output stream: a piece of a command's output (the first line of a follow is {following: NAME})",
        "type": "object",
        "properties": {
            "seq": {"type": "integer", "minimum": 0, "description": "the command's step"},
            "stream": {"enum": ["stdout", "stderr"]},
            "offset": {"type": "integer", "minimum": 0},
            "bytes": {"type": "string"},
            "finishedAt": {"type": "string", "format": "date-time"},
            "following": {"type": "string", "description": "the run's name: the first line of a follow, alone"},
        },
    }));
    named.insert("MergePatch".into(), json!({
        "description": "A JSON merge patch (RFC 7386) of the object: members of spec and metadata.labels to set, null to remove one",
        "type": "object",
    }));
    named.insert("AgentRunBatch".into(), json!({
        "description": "A batch of up to 100 runs, created together (an Idempotency-Key header makes a retry answer the same runs)",
        "type": "object",
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"const": "AgentRunList"},
            "metadata": {"type": "object"},
            "items": {"type": "array", "items": schema_ref("AgentRun"), "maxItems": nodus_core::engine::MAX_BATCH},
        },
        "required": ["kind", "items"],
        "additionalProperties": false,
    }));
    let reason = generator.subschema_for::<Reason>();
    let details = generator.subschema_for::<Invalid>();
    named.insert("Status".into(), json!({
        "description": "An error: its HTTP code, a stable reason scripts can rely on, a sentence; for Invalid the field, the rule and the value",
        "type": "object",
        "properties": {
            "kind": {"const": "Status"},
            "status": {"const": "Failure"},
            "code": {"type": "integer"},
            "reason": reason,
            "message": {"type": "string"},
            "details": details,
        },
        "required": ["kind", "status", "code", "reason", "message"],
        "additionalProperties": false,
    }));
    named.insert("Deleted".into(), json!({
        "type": "object",
        "properties": {"kind": {"const": "Status"}, "status": {"const": "Success"}, "message": {"type": "string"}},
        "required": ["kind", "status", "message"],
        "additionalProperties": false,
    }));
    let step = generator.subschema_for::<StepView>();
    named.insert("StepList".into(), json!({
        "type": "object",
        "properties": {
            "kind": {"const": "StepList"},
            "items": {"type": "array", "items": {"allOf": [step], "properties": {
                "intent": {"description": "with payload=true: what the step set out to do"},
                "outcome": {"description": "with payload=true: what came of it (absent while it runs)"},
            }}},
        },
        "required": ["kind", "items"],
        "additionalProperties": false,
    }));
    let run_phase = json!({"type": ["string", "null"], "enum": phase_names()});
    named.insert("Answer".into(), json!({
        "type": "object",
        "properties": {"answer": {"type": ["string", "null"], "description": "the whole answer of the last answered turn"}, "phase": run_phase},
        "required": ["answer", "phase"],
        "additionalProperties": false,
    }));
    let result = generator.subschema_for::<RunResultInfo>();
    named.insert("RunResultList".into(), json!({
        "type": "object",
        "properties": {"kind": {"const": "RunResultList"}, "phase": run_phase, "items": {"type": "array", "items": result}},
        "required": ["kind", "phase", "items"],
        "additionalProperties": false,
    }));
    let case = generator.subschema_for::<CaseResult>();
    named.insert("EvaluationResultList".into(), json!({
        "type": "object",
        "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"const": "EvaluationResultList"}, "group": {"type": "string"}, "items": {"type": "array", "items": case.clone()}},
        "required": ["apiVersion", "kind", "group", "items"],
        "additionalProperties": false,
    }));
    named.insert("EvaluationRetry".into(), json!({
        "type": "object",
        "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"const": "EvaluationRetry"}, "group": {"type": "string"}, "retried": {"type": "array", "items": case}},
        "required": ["apiVersion", "kind", "group", "retried"],
        "additionalProperties": false,
    }));
    let action = generator.subschema_for::<ActionInfo>();
    named.insert("PostRunActionList".into(), json!({
        "type": "object",
        "properties": {"kind": {"const": "PostRunActionList"}, "items": {"type": "array", "items": action}},
        "required": ["kind", "items"],
        "additionalProperties": false,
    }));
    named.insert(
        "Replica".into(),
        json!({
            "type": "object",
            "properties": {
                "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
                "spec": {"type": "object", "properties": {
                    "role": {"enum": ["all", "api", "worker"]},
                    "capacity": {"type": "integer", "minimum": 0},
                    "version": {"type": "string"},
                    "drain": {"type": "boolean", "description": "true once an operator asked the replica to drain (`nodus server drain NAME`)"}}},
                "status": {"type": "object", "properties": {
                    "inUse": {"type": "integer", "minimum": 0},
                    "heartbeat": {"type": "string", "format": "date-time"},
                    "draining": {"type": "boolean"}}}
            }
        }),
    );
    named.insert(
        "ReplicaList".into(),
        json!({
            "type": "object",
            "properties": {"kind": {"const": "ReplicaList"}, "items": {"type": "array", "items": schema_ref("Replica")}},
            "required": ["kind", "items"],
        }),
    );
    generator.subschema_for::<Account>();
    generator.subschema_for::<AddCredits>();
    generator.subschema_for::<MessageBody>();
    generator.subschema_for::<ForkBody>();
    named.insert("Delivery".into(), json!({
        "type": "object",
        "properties": {
            "seq": {"type": "integer", "minimum": 0, "description": "the message's place among the run's messages"},
            "duplicate": {"type": "boolean", "description": "true: a message with this messageKey was already delivered (answered 200, not 201)"},
            "messageKey": {"type": ["string", "null"]},
        },
        "required": ["seq", "duplicate", "messageKey"],
        "additionalProperties": false,
    }));
    generator.subschema_for::<ResolveBody>();
    generator.subschema_for::<RetryRequest>();
    generator.subschema_for::<RescoreBody>();
    named.extend(token_schemas());
    named.extend(generator.take_definitions(true));
    for schema in named.values_mut() {
        as_enum(schema);
    }
    named
}

/// A documented Rust enum of unit variants, which schemars writes as a `oneOf` of `const`s
/// (one per variant, with its doc comment), written as the `enum` of strings generators
/// understand (some try only the first branch of such a `oneOf`), the variants' comments
/// kept in the description. Applied to every schema, at every depth.
fn as_enum(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let constants = object
                .get("oneOf")
                .and_then(Value::as_array)
                .and_then(|branches| {
                    branches
                        .iter()
                        .map(|branch| {
                            let value = branch.get("const")?.as_str()?;
                            let described = branch.get("description").and_then(Value::as_str);
                            Some((value.to_string(), described.map(str::to_string)))
                        })
                        .collect::<Option<Vec<_>>>()
                });
            if let Some(constants) = constants {
                object.remove("oneOf");
                let said: Vec<String> = constants
                    .iter()
                    .filter_map(|(value, described)| {
                        described.as_ref().map(|d| format!("{value}: {d}"))
                    })
                    .collect();
                if !said.is_empty() {
                    let before = object.get("description").and_then(Value::as_str);
                    let description =
                        before.map(|b| format!("{b}\n\n")).unwrap_or_default() + &said.join("\n");
                    object.insert("description".into(), json!(description));
                }
                object.insert("type".into(), json!("string"));
                let values: Vec<&str> = constants.iter().map(|(value, _)| value.as_str()).collect();
                object.insert("enum".into(), json!(values));
            }
            object.values_mut().for_each(as_enum);
        }
        Value::Array(items) => items.iter_mut().for_each(as_enum),
        _ => {}
    }
}

/// Every run phase's name, and null for a run not yet started.
fn phase_names() -> Vec<Value> {
    let mut names: Vec<&str> = nodus_core::lifecycle::RunPhase::all()
        .into_iter()
        .map(nodus_core::lifecycle::RunPhase::name)
        .collect();
    names.dedup();
    names
        .into_iter()
        .map(Value::from)
        .chain([Value::Null])
        .collect()
}

/// Projects and tokens, as the server writes them.
fn token_schemas() -> Map<String, Value> {
    let name = json!({"type": "string", "description": "a DNS-1123 label"});
    let request_meta = json!({"type": "object", "properties": {"name": name, "project": {"type": "string"}}, "required": ["name"], "additionalProperties": false});
    let mut named = Map::new();
    named.insert("ProjectWrite".into(), json!({
        "type": "object",
        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": request_meta},
        "required": ["metadata"],
        "additionalProperties": false,
    }));
    named.insert("Project".into(), json!({
        "type": "object",
        "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"const": "Project"}, "metadata": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": false}},
        "required": ["apiVersion", "kind", "metadata"],
        "additionalProperties": false,
    }));
    named.insert("ProjectList".into(), json!({
        "type": "object",
        "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"const": "ProjectList"}, "items": {"type": "array", "items": schema_ref("Project")}},
        "required": ["apiVersion", "kind", "items"],
        "additionalProperties": false,
    }));
    named.insert("TokenWrite".into(), json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": request_meta,
            "spec": {"type": "object", "properties": {
                "role": {"type": "string", "enum": ["read", "write", "admin"]},
                "expires": {"type": "string", "description": "a duration such as 30d, 12h, 90m or 1d12h"},
            }, "required": ["role"], "additionalProperties": false},
        },
        "required": ["metadata", "spec"],
        "additionalProperties": false,
    }));
    named.insert("Token".into(), json!({
        "description": "A token, never its secret; a created one's `token` is the secret, shown this once",
        "type": "object",
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"const": "Token"},
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}, "project": {"type": "string"}, "creationTimestamp": {"type": "string", "format": "date-time"}}, "required": ["name", "project", "creationTimestamp"], "additionalProperties": false},
            "spec": {"type": "object", "properties": {
                "role": {"type": "string", "enum": ["read", "write", "admin"]},
                "projects": {"type": "array", "items": {"type": "string"}},
                "operator": {"type": "boolean"},
                "expiresAt": {"type": "string", "format": "date-time"},
            }, "required": ["role", "projects"], "additionalProperties": false},
            "token": {"type": "string"},
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": false,
    }));
    named.insert("TokenList".into(), json!({
        "type": "object",
        "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"const": "TokenList"}, "items": {"type": "array", "items": schema_ref("Token")}},
        "required": ["apiVersion", "kind", "items"],
        "additionalProperties": false,
    }));
    named
}

/// What an operation may answer besides its success.
#[derive(Clone, Copy)]
enum Errors {
    /// Read a project's object: 401, 403, 404, 422 (a query), 429 (streams), 503.
    Read,
    /// Write one: 400 (not JSON), 401, 403, 404, 408, 409, 413, 422, 429, 503 too.
    Write,
}

/// The answers of an operation: its success (`ok`: code, description and content) and the
/// errors it may give, each a [`Status`](#/components/schemas/Status).
fn responses(ok: &[(&str, &str, Value)], errors: Errors) -> Value {
    let mut answers = Map::new();
    for (code, description, content) in ok {
        answers.insert(
            (*code).to_string(),
            json!({"description": description, "content": content}),
        );
    }
    let codes: &[(&str, &str)] = match errors {
        Errors::Read => &[
            (
                "400",
                "The query is not valid (a parameter of the wrong type, a limit out of 1..=1000, a continue token not made for this list; details names it)",
            ),
            ("401", "No valid bearer token"),
            (
                "403",
                "The token does not hold the project, or its role is too low",
            ),
            ("404", "No such object or project"),
            ("422", "A parameter breaks a rule (details names it)"),
            (
                "429",
                "TooManyRequests: the token (or console session) holds as many open streams and long polls as it may; try again after Retry-After seconds",
            ),
            (
                "503",
                "The store is unavailable, or the server holds as many streams as it may: try again after Retry-After seconds",
            ),
        ],
        Errors::Write => &[
            ("400", "The body is not JSON, or not of the expected shape"),
            ("401", "No valid bearer token"),
            (
                "403",
                "The token does not hold the project, or its role is too low",
            ),
            ("404", "No such object or project"),
            (
                "409",
                "AlreadyExists, Conflict (a stale resourceVersion), AgentRunFinished or AgentStopped",
            ),
            (
                "408",
                "The body did not arrive in time (a pause longer than the server's body timeout, or slower than its least rate)",
            ),
            (
                "413",
                "The body is larger than the route takes (32 MiB for a resource write, 2 MiB for any other)",
            ),
            (
                "429",
                "TooManyRequests: the token is sending as many request bodies as it may; try again after Retry-After seconds",
            ),
            (
                "422",
                "The body breaks a rule (details names the field, the rule and the value)",
            ),
            (
                "503",
                "The store is unavailable, or request bodies in flight hold all the memory the server gives them: try again after Retry-After seconds",
            ),
        ],
    };
    for (code, description) in codes {
        answers.insert(
            (*code).to_string(),
            json!({"description": description, "content": json_content(schema_ref("Status"))}),
        );
    }
    answers.insert(
        "405".into(),
        json!({"description": "The path does not take this method", "content": json_content(schema_ref("Status"))}),
    );
    Value::Object(answers)
}

/// A stream of JSON lines: a string to generators (which do not read line streams), each
/// line's schema named in the description and in `x-ndjson-item`, for those that do.
fn ndjson(description: &str, item: &str) -> Value {
    json!({
        "schema": {"type": "string", "description": format!("{description} ({item})")},
        "x-ndjson-item": schema_ref(item),
    })
}

fn json_content(schema: Value) -> Value {
    json!({"application/json": {"schema": schema}})
}

fn json_ok(
    code: &'static str,
    description: &'static str,
    schema: &str,
) -> (&'static str, &'static str, Value) {
    (code, description, json_content(schema_ref(schema)))
}

/// An operation: a summary, the bearer token, its answers, and its body when it takes one.
fn operation(summary: &str, responses: Value, body: Option<&str>) -> Value {
    let mut operation =
        json!({"summary": summary, "security": [{"bearer": []}], "responses": responses});
    if let Some(schema) = body {
        operation["requestBody"] =
            json!({"required": true, "content": json_content(schema_ref(schema))});
    }
    operation
}

fn with_parameters(mut operation: Value, parameters: Value) -> Value {
    operation["parameters"] = parameters;
    operation
}

/// What a path's collection segment holds, for operation ids and tags: each kind by its
/// plural, and the collections that are not kinds.
fn collection_name(segment: &str) -> Option<String> {
    Kind::WRITABLE
        .iter()
        .find(|kind| kind.plural() == segment)
        .map(ToString::to_string)
        .or_else(|| {
            let name = match segment {
                "projects" => "Project",
                "tokens" => "Token",
                "replicas" => "Replica",
                "postrunactions" => "PostRunAction",
                "credits" => "Credits",
                _ => return None,
            };
            Some(name.to_string())
        })
}

/// `word` with its first letter upper-case (`steps` -> `Steps`).
fn capitalized(word: &str) -> String {
    let mut letters = word.chars();
    letters
        .next()
        .map(|first| first.to_uppercase().chain(letters).collect())
        .unwrap_or_default()
}

/// The `operationId` and tag of `method` on `path`, in Kubernetes' style: a collection is
/// listed (`listAgentRuns`) and created in (`createAgentRun`); an object is read, replaced,
/// patched and deleted (`readAgentRun`); a subresource is read (`readAgentRunSteps`, and one
/// item of it `readAgentRunResult`), created in when it is a collection (`POST …/messages`:
/// `createAgentRunMessage`), or is the verb of an action (`cancelAgentGroup`). The tag is the
/// collection's name; the server's own paths are tagged `Server`.
fn operation_name(method: &str, path: &str) -> (String, String) {
    match (method, path) {
        ("get", "/healthz") => return ("readHealth".into(), "Server".into()),
        ("get", "/metrics") => return ("readMetrics".into(), "Server".into()),
        ("get", "/openapi.json") => return ("readOpenApiDocument".into(), "Server".into()),
        _ => {}
    }
    let segments: Vec<&str> = path
        .trim_start_matches("/apis/nodus.dev/v1/")
        .split('/')
        .collect();
    // Under a project: what follows `projects/{project}`.
    let segments = match segments.as_slice() {
        ["projects", "{project}", rest @ ..] if !rest.is_empty() => rest,
        all => all,
    };
    let (collection, rest) = segments.split_first().unwrap_or((&"", &[]));
    let noun = collection_name(collection).unwrap_or_else(|| capitalized(collection));
    let id = match (method, rest) {
        ("get", []) if noun == "Credits" => "readCredits".to_string(),
        ("post", []) if noun == "Credits" => "addCredits".to_string(),
        ("get", []) => format!("list{noun}s"),
        ("post", []) => format!("create{noun}"),
        ("get", [_]) => format!("read{noun}"),
        ("put", [_]) => format!("replace{noun}"),
        ("patch", [_]) => format!("patch{noun}"),
        ("delete", [_]) => format!("delete{noun}"),
        (method, [_, sub @ ..]) => {
            let words: Vec<&str> = sub
                .iter()
                .copied()
                .filter(|w| !w.starts_with('{'))
                .collect();
            let one_item = sub.last().is_some_and(|w| w.starts_with('{'));
            let named: String = words.iter().map(|w| capitalized(w)).collect();
            let singular = |name: &str| name.strip_suffix('s').unwrap_or(name).to_string();
            match (method, words.split_first()) {
                ("get", _) if one_item => format!("read{noun}{}", singular(&named)),
                ("get", _) => format!("read{noun}{named}"),
                ("post", Some((only, []))) if only.ends_with('s') => {
                    format!("create{noun}{}", singular(&named))
                }
                (_, Some((verb, more))) => {
                    let more: String = more.iter().map(|w| capitalized(w)).collect();
                    format!("{verb}{noun}{more}")
                }
                (method, None) => format!("{method}{noun}"),
            }
        }
        (method, _) => format!("{method}{noun}"),
    };
    (id, noun)
}

/// Gives every operation of `paths` its `operationId` and tag ([`operation_name`]).
fn name_operations(paths: &mut Map<String, Value>) {
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in item.iter_mut() {
            if method == "parameters" {
                continue;
            }
            let (id, tag) = operation_name(method, path);
            operation["operationId"] = json!(id);
            operation["tags"] = json!([tag]);
        }
    }
}

/// The schema of a `kind`'s object as written (a Secret's values are written, never read).
fn written_schema(kind: Kind) -> String {
    match kind {
        Kind::Secret => "SecretWrite".to_string(),
        kind => kind.to_string(),
    }
}

/// `POST` of a kind's collection: one object, or (runs only) a batch.
fn create_operation(kind: Kind, errors: Errors) -> Value {
    let mut create = if kind == Kind::AgentRun {
        let either = json!({"oneOf": [schema_ref("AgentRun"), schema_ref("AgentRunBatch")]});
        let mut create = operation(
            "Create a run, or a batch of up to 100 runs (an AgentRunList; Idempotency-Key makes a retry answer the first's runs)",
            responses(
                &[(
                    "201",
                    "Created: the run, or an AgentRunList of the batch's runs",
                    json_content(
                        json!({"oneOf": [schema_ref("AgentRun"), schema_ref("AgentRunList")]}),
                    ),
                )],
                errors,
            ),
            None,
        );
        create["requestBody"] = json!({"required": true, "content": json_content(either)});
        create
    } else {
        operation(
            &format!("Create a {kind}"),
            responses(&[json_ok("201", "Created", &kind.to_string())], errors),
            Some(&written_schema(kind)),
        )
    };
    if kind == Kind::AgentRun {
        create["parameters"] = json!([{"name": "Idempotency-Key", "in": "header", "required": false, "schema": {"type": "string"}, "description": "with an AgentRunList: a retry with the same key answers the runs of the first"}]);
    }
    create
}

/// The document.
pub fn document() -> Value {
    let project =
        json!({"name": "project", "in": "path", "required": true, "schema": {"type": "string"}});
    let name =
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}});
    let base = crate::api::PREFIX;
    let watch = |of: &str| {
        json!([
            {"name": "watch", "in": "query", "required": false, "schema": {"type": "boolean"},
             "description": format!("true: watch {of}. Without resourceVersion (on a list also 0 or empty), a stream of watch events as Kubernetes sends them (application/x-ndjson, one {{type, object}} a line: ADDED for each object there is, then ADDED, MODIFIED, DELETED as they happen, a BOOKMARK after the first events and while nothing happens) until timeoutSeconds or the server stops. With the resourceVersion an answer carried (an object's on its path, a list's digest on a list), a long poll: one answer as soon as the metadata.resourceVersion differs from it (at once if it already does; NotFound once an object is deleted), or as it is after timeoutSeconds or when the server stops")},
            {"name": "resourceVersion", "in": "query", "required": false, "schema": {"type": "string"},
             "description": "with watch=true: the metadata.resourceVersion you have (a long poll); a list's is a digest of its items' versions. On a list whose fieldSelector names one object (metadata.name=NAME), that object's version starts a stream from it"},
            {"name": "timeoutSeconds", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1, "maximum": crate::watch::MAX_STREAM_TIMEOUT.as_secs()},
             "description": format!("with watch=true: the longest wait of a long poll (at most {}, default {}) or the life of a stream (at most {}, default {})", crate::watch::MAX_TIMEOUT.as_secs(), crate::watch::DEFAULT_TIMEOUT.as_secs(), crate::watch::MAX_STREAM_TIMEOUT.as_secs(), crate::watch::DEFAULT_STREAM_TIMEOUT.as_secs())}
        ])
    };
    // The answer of a read that may be a watch: JSON, or the stream's events.
    let watched = |mut ok: (&'static str, &'static str, Value)| {
        ok.2["application/x-ndjson"] = ndjson(
            "with watch=true and no resourceVersion: one watch event a line, {type: ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, object}",
            "WatchEvent",
        );
        ok
    };
    let (read, write) = (Errors::Read, Errors::Write);
    let run = || json_ok("200", "The run", "AgentRun");
    let mut paths = Map::new();
    paths.insert(
        "/healthz".into(),
        json!({"get": {"summary": "Liveness", "responses": {"200": {"description": "ok", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}),
    );
    paths.insert(
        "/openapi.json".into(),
        json!({"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1", "content": json_content(json!({"type": "object"}))}}}}),
    );
    let mut metrics = operation(
        "Prometheus metrics: without a token the server's own counters only; with one, the runs of the projects it holds too (every project for the operator token)",
        json!({
            "200": {"description": "text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "401": {"description": "A token that is not valid", "content": json_content(schema_ref("Status"))},
            "503": {"description": "The store is unavailable", "content": json_content(schema_ref("Status"))},
        }),
        None,
    );
    metrics["security"] = json!([{}, {"bearer": []}]);
    paths.insert("/metrics".into(), json!({"get": metrics}));
    paths.insert("/apis/nodus.dev/v1/postrunactions".into(), json!({
        "get": operation("The post-run actions installed: kind, title, description, configSchema (any valid token)", responses(&[json_ok("200", "The actions", "PostRunActionList")], read), None),
    }));
    paths.insert("/apis/nodus.dev/v1/replicas".into(), json!({
        "get": operation("The replicas sharing this store: name, role, capacity, runs in use, last heartbeat, version, draining (the operator token)", responses(&[json_ok("200", "The replicas", "ReplicaList")], read), None),
    }));
    paths.insert("/apis/nodus.dev/v1/replicas/{name}/drain".into(), json!({
        "parameters": [name],
        "post": operation("Ask the replica NAME to drain, as SIGTERM does: it stops taking runs, lets its running commands finish up to its drain timeout, hands its runs over to the other replicas and stops; it hears the request through the store, wherever it runs (the operator token)", responses(&[json_ok("202", "Asked: the replica's record, spec.drain true", "Replica")], write), None),
    }));
    paths.insert(crate::api::PROJECTS.into(), json!({
        "get": operation("The projects the token holds (every project for the operator token)", responses(&[json_ok("200", "The projects", "ProjectList")], read), None),
        "post": operation("Create a project {metadata: {name}} (the operator token)", responses(&[json_ok("201", "Created", "Project")], write), Some("ProjectWrite")),
    }));
    paths.insert(format!("{base}/tokens"), json!({
        "parameters": [project],
        "get": operation("The project's tokens: name, projects, role, expiry, created; never a secret (admin)", responses(&[json_ok("200", "The tokens", "TokenList")], read), None),
        "post": operation("Create a token {metadata: {name}, spec: {role: read|write|admin, expires: 30d}}; the answer's `token` is the secret, shown this once (admin)", responses(&[json_ok("201", "Created, with its secret", "Token")], write), Some("TokenWrite")),
    }));
    paths.insert(format!("{base}/tokens/{{name}}"), json!({
        "parameters": [project, name],
        "get": operation("A token, without its secret (admin)", responses(&[json_ok("200", "The token", "Token")], read), None),
        "delete": operation("Revoke a token: refused from the next request on (admin)", responses(&[json_ok("200", "Revoked", "Deleted")], write), None),
    }));
    let mut list_parameters = json!([
        {"name": "labelSelector", "in": "query", "required": false, "schema": {"type": "string"}, "description": "key=value,…"},
        {"name": "fieldSelector", "in": "query", "required": false, "schema": {"type": "string"}, "description": "path=value,…"},
        {"name": "limit", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1, "maximum": crate::api::MAX_LIMIT}, "description": "at most this many objects, in creation order; metadata.continue is set when more remain (without it: all of them). Not with watch=true"},
        {"name": "continue", "in": "query", "required": false, "schema": {"type": "string"}, "description": "the metadata.continue of the previous answer to the same list: the objects after it. Not with watch=true"}
    ]);
    if let (Some(all), Value::Array(more)) = (list_parameters.as_array_mut(), watch("the list")) {
        all.extend(more);
    }
    for kind in Kind::WRITABLE {
        let plural = kind.plural();
        paths.insert(format!("{base}/{plural}"), json!({
            "parameters": [project],
            "get": with_parameters(operation(&format!("List {kind} objects (labelSelector, fieldSelector; limit and continue for chunks; watch=true to watch them)"), responses(&[watched(json_ok("200", "The objects, or their watch events", &format!("{kind}List")))], read), None), list_parameters.clone()),
            "post": create_operation(kind, write),
        }));
        let object = || json_ok("200", "The object as stored", &kind.to_string());
        paths.insert(format!("{base}/{plural}/{{name}}"), json!({
            "parameters": [project, name],
            "get": with_parameters(operation(&format!("Read a {kind} (watch=true to watch it)"), responses(&[watched(json_ok("200", "The object, or its watch events", &kind.to_string()))], read), None), watch("the object")),
            "put": operation("Replace spec and labels (metadata.resourceVersion for optimistic concurrency)", responses(&[object()], write), Some(&written_schema(kind))),
            "patch": {
                "summary": "A JSON merge patch (RFC 7386) of spec and metadata.labels",
                "security": [{"bearer": []}],
                "requestBody": {"required": true, "content": {"application/merge-patch+json": {"schema": schema_ref("MergePatch")}}},
                "responses": responses(&[object()], write),
            },
            "delete": operation(if kind == Kind::AgentGroup { "Delete the group with all its runs" } else { "Delete" }, responses(&[json_ok("200", "Deleted", "Deleted")], write), None),
        }));
    }
    let sub = |path: &str| format!("{base}/agentruns/{{name}}/{path}");
    paths.insert(sub("messages"), json!({"parameters": [project, name], "post": operation(
        "Send a message {payload, messageKey} to a keepAlive run",
        responses(&[json_ok("201", "Delivered", "Delivery"), json_ok("200", "Already delivered under this messageKey", "Delivery")], write),
        Some("MessageBody"),
    )}));
    paths.insert(sub("steps"), json!({"parameters": [project, name], "get": with_parameters(
        operation("The run's steps in order", responses(&[json_ok("200", "The steps", "StepList")], read), None),
        json!([{"name": "payload", "in": "query", "required": false, "schema": {"type": "boolean"}, "description": "true: each step with its intent and outcome"}]),
    )}));
    paths.insert(sub("logs"), json!({"parameters": [project, name], "get": with_parameters(
        operation(
            "The output of the run's commands as newline-delimited JSON: the recorded output of finished commands, one {seq, stream, offset, bytes, finishedAt} a line (tailLines, sinceSeconds); with follow=true, {following} first, those lines only when tailLines or sinceSeconds is given, then {seq, stream, offset, bytes} per piece as this server runs the commands, until the run ends",
            responses(&[("200", "The output", json!({"application/x-ndjson": ndjson("one LogLine a line", "LogLine")}))], read),
            None,
        ),
        json!([
            {"name": "follow", "in": "query", "required": false, "schema": {"type": "boolean"}, "description": "true: go on with the live output until the run ends"},
            {"name": "tailLines", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 0}, "description": "only the last this many lines of the recorded output"},
            {"name": "sinceSeconds", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1}, "description": "only the lines of commands whose step finished at most this many seconds ago (lines carry no time of their own)"}
        ]),
    )}));
    paths.insert(
        sub("answer"),
        json!({"parameters": [project, name], "get": operation(
            "The whole answer", responses(&[json_ok("200", "The answer", "Answer")], read), None,
        )}),
    );
    paths.insert(sub("workdir"), json!({"parameters": [project, name], "get": operation(
        "The final working directory of a finished run (a tar archive); 404 WorkdirNotKept when none was kept",
        responses(&[("200", "The archive", json!({
            "application/x-tar": {"schema": {"type": "string", "format": "binary", "contentMediaType": "application/x-tar"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        }))], read),
        None,
    )}));
    paths.insert(sub("results"), json!({"parameters": [project, name], "get": operation(
        "The results of a finished run, each with its name, fileName, contentType and bytes: inputWorkdir, outputWorkdir, artifacts (.tar.gz), runRecord and, unless it succeeded, error, and unless spec.autoTelemetry is false, trajectory (ATIF-v1.8; JSON), and for a run with an allowlist, egress (JSON Lines); none before it finishes",
        responses(&[json_ok("200", "The results", "RunResultList")], read),
        None,
    )}));
    let result = json!({"name": "result", "in": "path", "required": true, "schema": {"type": "string", "enum": nodus_core::engine::RESULT_NAMES}});
    paths.insert(sub("results/{result}"), json!({"parameters": [project, name, result], "get": operation(
        "One result of a finished run: a directory as application/gzip (a .tar.gz), a record as application/json, the egress records as application/jsonl (Content-Disposition names its file)",
        responses(&[("200", "The result's bytes", json!({
            "application/gzip": {"schema": {"type": "string", "format": "binary", "contentMediaType": "application/gzip"}},
            "application/json": {"schema": {"type": "object"}},
            "application/jsonl": {"schema": {"type": "string", "contentMediaType": "application/jsonl"}},
        }))], read),
        None,
    )}));
    for (path, summary) in [
        (
            "cancel",
            "Cancel the run (its sandbox is deleted); answers the run once it ended, or as it is after 10 s",
        ),
        (
            "close",
            "Close a keepAlive conversation: the run succeeds after its current turn (its sandbox is deleted)",
        ),
    ] {
        paths.insert(sub(path), json!({"parameters": [project, name], "post": operation(summary, responses(&[run()], write), None)}));
    }
    paths.insert(sub("fork"), json!({"parameters": [project, name], "post": operation(
        "Fork the run from a command step {atStep: N | \"last-good\", count, name, input, agent, replace}: new runs (all or nothing) whose journals begin with this run's steps up to it (inherited), whose working directories start from its snapshot and whose next model call sees `input` (when given) as a new user message; 422 names why a step cannot be forked from",
        responses(&[json_ok("201", "The forks", "AgentRunList")], write),
        Some("ForkBody"),
    )}));
    paths.insert(sub("resolve"), json!({"parameters": [project, name], "post": operation(
        "Resolve an uncertain step {action: retry|recordFailed|cancel}", responses(&[run()], write), Some("ResolveBody"),
    )}));
    paths.insert(format!("{base}/agentgroups/{{name}}/cancel"), json!({"parameters": [project, name], "post": operation(
        "Cancel every unfinished run of the group", responses(&[json_ok("200", "The group", "AgentGroup")], write), None,
    )}));
    paths.insert(format!("{base}/agentgroups/{{name}}/retry"), json!({"parameters": [project, name], "post": operation(
        "Retry the unscored cases of a finished evaluation group {reasons, tasks} (both optional): each gets a new attempt, a new member run recorded in the same group; a running or cancelled group, a task without an unscored case, or nothing to retry is refused (422)",
        responses(&[json_ok("200", "The retried cases", "EvaluationRetry")], write), Some("RetryRequest"),
    )}));
    paths.insert(format!("{base}/agentgroups/{{name}}/rescore"), json!({"parameters": [project, name], "post": operation(
        "Rescore a finished evaluation group {environment: name@version, name} as a new evaluation group (spec.evaluation.rescoreOf) that grades its kept answers and final working directories with that version's grader: no model call, no agent sandbox; refused (422) when the tasks differ or the payloads were removed",
        responses(&[json_ok("201", "The new group", "AgentGroup")], write), Some("RescoreBody"),
    )}));
    paths.insert(format!("{base}/agentgroups/{{name}}/results"), json!({"parameters": [project, name], "get": with_parameters(
        operation(
            "An evaluation group's per-case results in batch order; JSON Lines (one CaseResult a line) with Accept: application/x-ndjson or format=jsonl",
            responses(&[("200", "The results", json!({
                "application/json": {"schema": schema_ref("EvaluationResultList")},
                "application/x-ndjson": ndjson("one CaseResult a line", "CaseResult"),
            }))], read),
            None,
        ),
        json!([{"name": "format", "in": "query", "required": false, "schema": {"type": "string", "enum": ["json", "jsonl"]}}]),
    )}));
    paths.insert(format!("{base}/credits"), json!({
        "parameters": [project],
        "get": operation("The project's credits", responses(&[json_ok("200", "The account", "Account")], read), None),
        "post": operation("Add credits {addUSD} (admin)", responses(&[json_ok("200", "The account", "Account")], write), Some("AddCredits")),
    }));
    name_operations(&mut paths);
    let mut components = Map::new();
    components.insert(
        "securitySchemes".into(),
        json!({"bearer": {"type": "http", "scheme": "bearer"}}),
    );
    components.insert("schemas".into(), Value::Object(schemas()));
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Nodus", "version": env!("CARGO_PKG_VERSION"), "description": "Durable, cost-capped LLM agent runs in sandboxes."},
        "paths": paths,
        "components": components,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn refs(value: &Value, found: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    found.insert(target.clone());
                }
                map.values().for_each(|v| refs(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
            _ => {}
        }
    }

    /// The document's paths are the router's, one for one: the router's `{plural}` routes
    /// are one path per kind in the document.
    #[test]
    fn the_document_describes_every_route_and_no_other() {
        let document = document();
        let documented: BTreeSet<String> = document["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .cloned()
            .collect();
        let routed: BTreeSet<String> = crate::api::routes()
            .into_iter()
            .flat_map(|(path, _)| {
                if path.contains("{plural}") {
                    Kind::WRITABLE
                        .iter()
                        .map(|kind| path.replace("{plural}", kind.plural()))
                        .collect()
                } else {
                    vec![path]
                }
            })
            .collect();
        assert_eq!(documented, routed);
    }

    /// Every operation has an id, unique in the document, and a tag; the ids are
    /// Kubernetes' (as the issue that asked for them lists them).
    #[test]
    fn every_operation_has_its_own_id_and_a_tag() {
        let document = document();
        let mut ids = BTreeSet::new();
        for (path, item) in document["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("a path item") {
                if method == "parameters" {
                    continue;
                }
                let id = operation["operationId"].as_str().expect("an operationId");
                assert!(ids.insert(id.to_string()), "{id} twice ({method} {path})");
                assert!(
                    id.chars().all(|c| c.is_ascii_alphanumeric())
                        && id.starts_with(|c: char| c.is_ascii_lowercase()),
                    "{id}"
                );
                assert_eq!(operation["tags"].as_array().map(Vec::len), Some(1), "{id}");
            }
        }
        let runs = format!("{}/agentruns", crate::api::PREFIX);
        let id = |method: &str, path: &str| {
            document["paths"][path][method]["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}"))
                .to_string()
        };
        for (method, path, expected) in [
            ("get", runs.clone(), "listAgentRuns"),
            ("post", runs.clone(), "createAgentRun"),
            ("get", format!("{runs}/{{name}}"), "readAgentRun"),
            ("put", format!("{runs}/{{name}}"), "replaceAgentRun"),
            ("patch", format!("{runs}/{{name}}"), "patchAgentRun"),
            ("delete", format!("{runs}/{{name}}"), "deleteAgentRun"),
            ("get", format!("{runs}/{{name}}/steps"), "readAgentRunSteps"),
            (
                "post",
                format!("{runs}/{{name}}/messages"),
                "createAgentRunMessage",
            ),
            (
                "get",
                format!("{runs}/{{name}}/results/{{result}}"),
                "readAgentRunResult",
            ),
            (
                "post",
                format!("{}/agentgroups/{{name}}/cancel", crate::api::PREFIX),
                "cancelAgentGroup",
            ),
            (
                "get",
                format!("{}/agents", crate::api::PREFIX),
                "listAgents",
            ),
            (
                "get",
                format!("{}/tokens/{{name}}", crate::api::PREFIX),
                "readToken",
            ),
            ("get", crate::api::PROJECTS.to_string(), "listProjects"),
            ("get", "/healthz".to_string(), "readHealth"),
        ] {
            assert_eq!(id(method, &path), expected, "{method} {path}");
        }
        assert_eq!(
            document["paths"][runs.as_str()]["get"]["tags"],
            json!(["AgentRun"])
        );
    }

    /// Every `$ref` names a schema the document holds, and every kind's schema is its real
    /// shape: its spec's fields, not an open object.
    #[test]
    fn every_reference_resolves_and_every_kind_has_its_fields() {
        let document = document();
        let mut found = BTreeSet::new();
        refs(&document, &mut found);
        let schemas = document["components"]["schemas"]
            .as_object()
            .expect("schemas");
        for target in &found {
            let name = target
                .strip_prefix(SCHEMAS)
                .unwrap_or_else(|| panic!("{target}"));
            assert!(
                schemas.contains_key(name),
                "{target} is not in components.schemas"
            );
        }
        for (kind, field) in [
            ("Agent", "system"),
            ("AgentRun", "agent"),
            ("AgentGroup", "limits"),
            ("Budget", "maxSpendUSD"),
            ("FileSet", "files"),
            ("AgentEnvironment", "env"),
            ("Environment", "grader"),
        ] {
            let spec = &schemas[kind]["properties"]["spec"]["$ref"];
            let spec = spec
                .as_str()
                .and_then(|s| s.strip_prefix(SCHEMAS))
                .expect(kind);
            assert!(
                schemas[spec]["properties"][field].is_object(),
                "{kind}.spec.{field}: {}",
                schemas[spec]
            );
            assert_eq!(schemas[spec]["additionalProperties"], false, "{kind}");
        }
        assert_eq!(
            schemas["StepState"]["enum"],
            json!(["Started", "Completed", "Failed", "Uncertain", "Cancelled"]),
            "a documented enum is an enum of strings, not a oneOf of consts"
        );
        assert!(schemas["Secret"]["properties"]["keys"].is_object());
        assert!(schemas["SecretWrite"]["properties"]["stringData"].is_object());
        assert!(schemas["Status"]["properties"]["details"].is_object());
    }
}
