//! The OpenAPI document served at `/openapi.json`.

use serde_json::{Value, json};

fn operation(summary: &str, ok: &str) -> Value {
    json!({
        "summary": summary,
        "security": [{"bearer": []}],
        "responses": {
            ok: {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
            "default": {"description": "An error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Status"}}}}
        }
    })
}

fn with_body(mut operation: Value, description: &str) -> Value {
    operation["requestBody"] = json!({
        "required": true,
        "description": description,
        "content": {"application/json": {"schema": {"type": "object"}}}
    });
    operation
}

/// The document.
pub fn document() -> Value {
    let project =
        json!({"name": "project", "in": "path", "required": true, "schema": {"type": "string"}});
    let plurals: Vec<&str> = nodus_core::engine::WRITABLE_KINDS
        .iter()
        .map(|kind| kind.plural())
        .collect();
    let plural = json!({"name": "plural", "in": "path", "required": true, "schema": {"type": "string", "enum": plurals}});
    let name =
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}});
    let base = "/apis/nodus.dev/v1/projects/{project}";
    let watch = |of: &str| {
        json!([
            {"name": "watch", "in": "query", "required": false, "schema": {"type": "boolean"},
             "description": format!("true: a long poll, not a stream; answers {of} as soon as its metadata.resourceVersion differs from resourceVersion (at once if it already does; NotFound once an object is deleted), or as it is after timeoutSeconds or when the server stops. Ask again with the version answered")},
            {"name": "resourceVersion", "in": "query", "required": false, "schema": {"type": "string"},
             "description": "with watch=true (required there): the metadata.resourceVersion you have; a list's is a digest of its items' versions"},
            {"name": "timeoutSeconds", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1, "maximum": crate::watch::MAX_TIMEOUT.as_secs(), "default": crate::watch::DEFAULT_TIMEOUT.as_secs()},
             "description": "with watch=true: the longest wait"}
        ])
    };
    let with_query = |mut operation: Value, parameters: Value| {
        operation["parameters"] = parameters;
        operation
    };
    let mut paths = serde_json::Map::new();
    paths.insert(
        "/healthz".into(),
        json!({"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}}),
    );
    paths.insert("/metrics".into(), json!({"get": {"summary": "Prometheus metrics: without a token the server's own counters only; with one, the runs of the projects it holds too (every project for the operator token)", "security": [{}, {"bearer": []}], "responses": {"200": {"description": "text exposition format"}}}}));
    paths.insert("/apis/nodus.dev/v1/postrunactions".into(), json!({
        "get": operation("The post-run actions installed: kind, title, description, configSchema (any valid token)", "200"),
    }));
    paths.insert("/apis/nodus.dev/v1/projects".into(), json!({
        "get": operation("The projects the token holds (every project for the operator token)", "200"),
        "post": with_body(operation("Create a project {metadata: {name}} (the operator token)", "201"), "{\"metadata\": {\"name\": \"NAME\"}}"),
    }));
    paths.insert(format!("{base}/tokens"), json!({
        "parameters": [project],
        "get": operation("The project's tokens: name, projects, role, expiry, created; never a secret (admin)", "200"),
        "post": with_body(operation("Create a token {metadata: {name}, spec: {role: read|write|admin, expires: 30d}}; the answer's `token` is the secret, shown this once (admin)", "201"), "the token"),
    }));
    paths.insert(
        format!("{base}/tokens/{{name}}"),
        json!({
            "parameters": [project, name],
            "get": operation("A token, without its secret (admin)", "200"),
            "delete": operation("Revoke a token: refused from the next request on (admin)", "200"),
        }),
    );
    paths.insert(format!("{base}/{{plural}}"), json!({
        "parameters": [project, plural],
        "get": with_query(operation("List objects (labelSelector, fieldSelector; watch=true to wait for a change)", "200"), {
            let mut parameters = json!([
                {"name": "labelSelector", "in": "query", "required": false, "schema": {"type": "string"}, "description": "key=value,…"},
                {"name": "fieldSelector", "in": "query", "required": false, "schema": {"type": "string"}, "description": "path=value,…"}
            ]);
            if let (Some(all), Value::Array(more)) = (parameters.as_array_mut(), watch("the list")) {
                all.extend(more);
            }
            parameters
        }),
        "post": with_body(operation("Create an object, or a batch of up to 100 runs (AgentRunList, Idempotency-Key)", "201"), "the object"),
    }));
    paths.insert(format!("{base}/{{plural}}/{{name}}"), json!({
        "parameters": [project, plural, name],
        "get": with_query(operation("Read an object (watch=true to wait for a change)", "200"), watch("the object")),
        "put": with_body(operation("Replace spec and labels (metadata.resourceVersion for optimistic concurrency)", "200"), "the object"),
        "patch": with_body(operation("JSON merge patch of spec and labels", "200"), "the merge patch"),
        "delete": operation("Delete (a group with all its runs)", "200"),
    }));
    for (sub, method, summary, ok) in [
        (
            "messages",
            "post",
            "Send a message {payload, messageKey}",
            "201",
        ),
        ("steps", "get", "The run's steps in order", "200"),
        (
            "logs",
            "get",
            "With follow=true: the output of the run's commands as this server runs them, as newline-delimited JSON {seq, stream, offset, bytes}, until the run ends",
            "200",
        ),
        ("answer", "get", "The whole answer", "200"),
        (
            "workdir",
            "get",
            "The final working directory of a run with spec.workdir (application/x-tar)",
            "200",
        ),
        (
            "results",
            "get",
            "The results of a finished run, each with its name, fileName, contentType and bytes: inputWorkdir, outputWorkdir, artifacts (.tar.gz), runRecord and, unless it succeeded, error (JSON); none before it finishes",
            "200",
        ),
        (
            "cancel",
            "post",
            "Cancel the run (its sandbox is deleted)",
            "200",
        ),
        (
            "close",
            "post",
            "Close a keepAlive conversation: the run succeeds after its current turn (its sandbox is deleted)",
            "200",
        ),
        (
            "resolve",
            "post",
            "Resolve an uncertain step {action: retry|recordFailed|cancel}",
            "200",
        ),
    ] {
        let op = if method == "post" && !matches!(sub, "cancel" | "close") {
            with_body(operation(summary, ok), summary)
        } else {
            operation(summary, ok)
        };
        paths.insert(
            format!("{base}/agentruns/{{name}}/{sub}"),
            json!({"parameters": [project, name], method: op}),
        );
    }
    let result = json!({"name": "result", "in": "path", "required": true, "schema": {"type": "string", "enum": nodus_core::engine::RESULT_NAMES}});
    paths.insert(
        format!("{base}/agentruns/{{name}}/results/{{result}}"),
        json!({"parameters": [project, name, result], "get": operation("One result of a finished run: a directory as application/gzip (a .tar.gz), a record as application/json", "200")}),
    );
    paths.insert(format!("{base}/agentgroups/{{name}}/cancel"), json!({"parameters": [project, name], "post": operation("Cancel every unfinished run of the group", "200")}));
    paths.insert(format!("{base}/agentgroups/{{name}}/results"), json!({"parameters": [project, name], "get": with_query(
        operation("An evaluation group's per-case results in batch order ({items: [{taskId, repetition, state, reason, reward, verdict, evidence, run, environment, split, seed, imageDigest, gradings}]}); JSON Lines with Accept: application/x-ndjson or format=jsonl", "200"),
        json!([{"name": "format", "in": "query", "required": false, "schema": {"type": "string", "enum": ["json", "jsonl"]}}]),
    )}));
    paths.insert(format!("{base}/credits"), json!({
        "parameters": [project],
        "get": operation("The project's credits", "200"),
        "post": with_body(operation("Add credits {addUSD} (admin)", "200"), "{\"addUSD\": \"5.00\"}"),
    }));
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Nodus", "version": env!("CARGO_PKG_VERSION"), "description": "Durable, cost-capped LLM agent runs in sandboxes."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Status": {"type": "object", "properties": {
                "kind": {"const": "Status"}, "status": {"const": "Failure"}, "code": {"type": "integer"},
                "reason": {"type": "string", "description": "Stable: Invalid, NotFound, Conflict, AlreadyExists, AgentRunFinished, AgentStopped, Unauthorized, Forbidden, Unavailable, InternalError"},
                "message": {"type": "string"},
                "details": {"type": "object", "properties": {"field": {"type": "string"}, "rule": {"type": "string"}, "value": {"type": "string"}}}
            }, "required": ["kind", "status", "code", "reason", "message"]}}
        }
    })
}
