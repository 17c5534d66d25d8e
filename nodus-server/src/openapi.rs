//! The OpenAPI 3.1 document served at `/openapi.json`: every route of [`crate::api::routes`]
//! with its parameters, bodies and answers, and every body's schema derived from the Rust
//! types that read or write it (schemars, `nodus-core`'s `openapi` feature).

use nodus_core::engine::{Reason, RunResultInfo, StepView, WRITABLE_KINDS};
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
use crate::api::runs::{MessageBody, RescoreBody, ResolveBody};

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
    let read: Vec<Value> = WRITABLE_KINDS
        .iter()
        .map(|kind| schema_ref(&kind.to_string()))
        .collect();
    let written: Vec<Value> = WRITABLE_KINDS
        .iter()
        .map(|kind| match kind {
            Kind::Secret => schema_ref("SecretWrite"),
            kind => schema_ref(&kind.to_string()),
        })
        .chain([schema_ref("AgentRunList")])
        .collect();
    named.insert("Resource".into(), json!({"description": "An object of one of the kinds, as read (a Secret shows its keys, never its values)", "oneOf": read}));
    named.insert("ResourceWrite".into(), json!({"description": "An object of the path's kind as written, or (on agentruns) an AgentRunList: a batch of up to 100 runs", "oneOf": written}));
    let lists: Vec<String> = WRITABLE_KINDS
        .iter()
        .map(|kind| format!("{kind}List"))
        .collect();
    named.insert("ResourceList".into(), json!({
        "type": "object",
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"type": "string", "enum": lists},
            "metadata": {"type": "object", "properties": {"resourceVersion": {"type": "string", "description": "a digest of the items' versions, for watch=true"}, "continue": {"type": "string", "description": "with limit: present only when more objects remain; pass it as continue= to get the next ones (opaque; it holds for the same project, kind and selectors only)"}}, "required": ["resourceVersion"], "additionalProperties": false},
            "items": {"type": "array", "items": schema_ref("Resource")},
        },
        "required": ["apiVersion", "kind", "items"],
        "additionalProperties": false,
    }));
    named.insert("AgentRunList".into(), json!({
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
        "ReplicaList".into(),
        json!({
            "type": "object",
            "properties": {"kind": {"const": "ReplicaList"}, "items": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
                    "spec": {"type": "object", "properties": {
                        "role": {"enum": ["all", "api", "worker"]},
                        "capacity": {"type": "integer", "minimum": 0},
                        "version": {"type": "string"}}},
                    "status": {"type": "object", "properties": {
                        "inUse": {"type": "integer", "minimum": 0},
                        "heartbeat": {"type": "string", "format": "date-time"},
                        "draining": {"type": "boolean"}}}
                }
            }}},
            "required": ["kind", "items"],
        }),
    );
    generator.subschema_for::<Account>();
    generator.subschema_for::<AddCredits>();
    generator.subschema_for::<MessageBody>();
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
    named
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

/// The document.
pub fn document() -> Value {
    let project =
        json!({"name": "project", "in": "path", "required": true, "schema": {"type": "string"}});
    let plurals: Vec<&str> = WRITABLE_KINDS.iter().map(|kind| kind.plural()).collect();
    let plural = json!({"name": "plural", "in": "path", "required": true, "schema": {"type": "string", "enum": plurals}});
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
        ok.2["application/x-ndjson"] = json!({"schema": {"type": "string", "description": "with watch=true and no resourceVersion: one watch event a line, {type: ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, object}"}});
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
    let mut create = operation(
        "Create an object of the path's kind, or a batch of up to 100 runs (AgentRunList, Idempotency-Key)",
        responses(
            &[(
                "201",
                "Created: the object, or an AgentRunList of the batch's runs",
                json_content(
                    json!({"oneOf": [schema_ref("Resource"), schema_ref("ResourceList")]}),
                ),
            )],
            write,
        ),
        Some("ResourceWrite"),
    );
    create["parameters"] = json!([{"name": "Idempotency-Key", "in": "header", "required": false, "schema": {"type": "string"}, "description": "with an AgentRunList: a retry with the same key answers the runs of the first"}]);
    paths.insert(format!("{base}/{{plural}}"), json!({
        "parameters": [project, plural],
        "get": with_parameters(operation("List objects (labelSelector, fieldSelector; limit and continue for chunks; watch=true to watch them)", responses(&[watched(json_ok("200", "The objects, or their watch events", "ResourceList"))], read), None), list_parameters),
        "post": create,
    }));
    paths.insert(format!("{base}/{{plural}}/{{name}}"), json!({
        "parameters": [project, plural, name],
        "get": with_parameters(operation("Read an object (watch=true to watch it)", responses(&[watched(json_ok("200", "The object, or its watch events", "Resource"))], read), None), watch("the object")),
        "put": operation("Replace spec and labels (metadata.resourceVersion for optimistic concurrency)", responses(&[json_ok("200", "The object as stored", "Resource")], write), Some("ResourceWrite")),
        "patch": {
            "summary": "JSON merge patch of spec and labels",
            "security": [{"bearer": []}],
            "requestBody": {"required": true, "content": {"application/merge-patch+json": {"schema": {"type": "object"}}, "application/json": {"schema": {"type": "object"}}}},
            "responses": responses(&[json_ok("200", "The object as stored", "Resource")], write),
        },
        "delete": operation("Delete (a group with all its runs)", responses(&[json_ok("200", "Deleted", "Deleted")], write), None),
    }));
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
            responses(&[("200", "The output", json!({"application/x-ndjson": {"schema": {"type": "string"}}}))], read),
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
        responses(&[("200", "The archive", json!({"application/x-tar": {"schema": {"type": "string", "contentMediaType": "application/x-tar"}}}))], read),
        None,
    )}));
    paths.insert(sub("results"), json!({"parameters": [project, name], "get": operation(
        "The results of a finished run, each with its name, fileName, contentType and bytes: inputWorkdir, outputWorkdir, artifacts (.tar.gz), runRecord and, unless it succeeded, error, and unless spec.autoTelemetry is false, trajectory (ATIF-v1.8; JSON); none before it finishes",
        responses(&[json_ok("200", "The results", "RunResultList")], read),
        None,
    )}));
    let result = json!({"name": "result", "in": "path", "required": true, "schema": {"type": "string", "enum": nodus_core::engine::RESULT_NAMES}});
    paths.insert(sub("results/{result}"), json!({"parameters": [project, name, result], "get": operation(
        "One result of a finished run: a directory as application/gzip (a .tar.gz), a record as application/json (Content-Disposition names its file)",
        responses(&[("200", "The result's bytes", json!({
            "application/gzip": {"schema": {"type": "string", "contentMediaType": "application/gzip"}},
            "application/json": {"schema": {"type": "object"}},
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
                "application/x-ndjson": {"schema": {"type": "string"}},
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

    /// The document's paths are the router's, one for one.
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
            .map(|(path, _)| path)
            .collect();
        assert_eq!(documented, routed);
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
        assert!(schemas["Secret"]["properties"]["keys"].is_object());
        assert!(schemas["SecretWrite"]["properties"]["stringData"].is_object());
        assert!(schemas["Status"]["properties"]["details"].is_object());
    }
}
