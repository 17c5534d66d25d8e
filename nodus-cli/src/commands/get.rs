//! `nodus get`: list or show objects as a table, YAML, JSON, names or a JSONPath template.

use nodus_core::resource::Kind;
use reqwest::Method;
use serde_json::{Value, json};

use super::{out, outln};
use crate::cli::{GetArgs, Output};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::jsonpath::Template;
use crate::kinds::{parse_targets, qualified};
use crate::table;
use crate::yaml;

/// `nodus get postrunactions`: the post-run actions the server installs (KIND, TITLE,
/// DESCRIPTION), or the list as yaml or json.
async fn post_run_actions(client: &Client, output: Option<Output>) -> Result<()> {
    let list = client
        .send(
            Method::GET,
            &["apis", "nodus.dev", "v1", "postrunactions"],
            &[],
            None,
            &[],
        )
        .await?;
    match output {
        None | Some(Output::Table | Output::Wide) => {
            let mut table = table::Table::new(&["KIND", "TITLE", "DESCRIPTION"]);
            for item in list["items"].as_array().cloned().unwrap_or_default() {
                table.rows.push(
                    ["kind", "title", "description"]
                        .iter()
                        .map(|field| crate::jsonpath::scalar_text(&item[*field]))
                        .collect(),
                );
            }
            out(&table.render());
        }
        Some(Output::Yaml) => out(&yaml::to_yaml(&list)?),
        Some(Output::Json) => outln(&serde_json::to_string_pretty(&list).unwrap_or_default()),
        Some(_) => {
            return Err(Error::usage(
                "get postrunactions prints a table, yaml or json",
            ));
        }
    }
    Ok(())
}

/// `nodus get replicas`: the replicas sharing the server's store (NAME, ROLE, CAPACITY,
/// IN-USE, HEARTBEAT, VERSION, DRAINING), or the list as yaml or json.
async fn replicas(client: &Client, output: Option<Output>) -> Result<()> {
    let list = client
        .send(
            Method::GET,
            &["apis", "nodus.dev", "v1", "replicas"],
            &[],
            None,
            &[],
        )
        .await?;
    match output {
        None | Some(Output::Table | Output::Wide) => {
            let mut table = table::Table::new(&[
                "NAME",
                "ROLE",
                "CAPACITY",
                "IN-USE",
                "HEARTBEAT",
                "VERSION",
                "DRAINING",
            ]);
            for item in list["items"].as_array().cloned().unwrap_or_default() {
                table.rows.push(
                    [
                        "/metadata/name",
                        "/spec/role",
                        "/spec/capacity",
                        "/status/inUse",
                        "/status/heartbeat",
                        "/spec/version",
                        "/status/draining",
                    ]
                    .iter()
                    .map(|at| {
                        crate::jsonpath::scalar_text(item.pointer(at).unwrap_or(&Value::Null))
                    })
                    .collect(),
                );
            }
            out(&table.render());
        }
        Some(Output::Yaml) => out(&yaml::to_yaml(&list)?),
        Some(Output::Json) => outln(&serde_json::to_string_pretty(&list).unwrap_or_default()),
        Some(_) => return Err(Error::usage("get replicas prints a table, yaml or json")),
    }
    Ok(())
}

pub async fn run(client: &Client, args: GetArgs) -> Result<()> {
    if let [only] = args.targets.as_slice()
        && matches!(only.to_ascii_lowercase().as_str(), "replicas" | "replica")
    {
        return replicas(client, args.output).await;
    }
    if let [only] = args.targets.as_slice()
        && matches!(
            only.to_ascii_lowercase().as_str(),
            "postrunactions" | "postrunaction"
        )
    {
        return post_run_actions(client, args.output).await;
    }
    if let Some((kind, names)) = super::access::AccessKind::parse(&args.targets) {
        return super::access::get(client, kind, names, args).await;
    }
    if args.targets.first().map(String::as_str) == Some("results") {
        return results(client, args).await;
    }
    let (kind, names) = parse_targets(&args.targets)?;
    let output = args.output.clone().unwrap_or(Output::Table);
    let template = match &output {
        Output::JsonPath(text) => Some(Template::parse(text).map_err(Error::usage)?),
        _ => None,
    };
    if args.watch {
        return watch(client, kind, &names, &args, &output, template.as_ref()).await;
    }
    let mut failures = Vec::new();
    let (document, items) = if names.is_empty() {
        let mut query = Vec::new();
        if let Some(selector) = &args.selector {
            query.push(("labelSelector", selector.as_str()));
        }
        if let Some(selector) = &args.field_selector {
            query.push(("fieldSelector", selector.as_str()));
        }
        read_list(client, kind, &query, args.chunk_size, args.limit).await?
    } else {
        if args.selector.is_some() || args.field_selector.is_some() {
            return Err(Error::usage(
                "selectors (-l, --field-selector) apply to lists, not to named objects",
            ));
        }
        if args.limit.is_some() {
            return Err(Error::usage(
                "--limit applies to lists, not to named objects",
            ));
        }
        // Like kubectl: the ones found are printed, and each one missing is an error.
        let mut items = Vec::new();
        for name in &names {
            match client.get(&[kind.plural(), name]).await {
                Ok(item) => items.push(item),
                Err(error) if error.exit_code() == crate::error::exit::REFUSED => {
                    eprintln!("{}", error.render());
                    failures.push(error);
                }
                Err(error) => return Err(error),
            }
        }
        if items.is_empty() {
            return super::reported(&failures);
        }
        let document = match (names.len(), items.as_slice()) {
            (1, [one]) => one.clone(),
            _ => {
                json!({"apiVersion": "nodus.dev/v1", "kind": format!("{kind}List"), "items": items})
            }
        };
        (document, items)
    };
    print(
        kind,
        &output,
        template.as_ref(),
        &document,
        &items,
        &client.project,
    )?;
    super::reported(&failures)
}

/// The longest watch the server streams, asked for by `get -w`.
const WATCH_SECONDS: &str = "3600";

/// `get -w`: the API's watch stream of the list (or of one object, by its name as kubectl
/// watches one: `fieldSelector=metadata.name=NAME`). The objects there are (the `ADDED`
/// events up to the bookmark that ends them) are printed as `get` prints them; then each
/// change as it comes: a table row without the header, or the object in the chosen format.
async fn watch(
    client: &Client,
    kind: Kind,
    names: &[String],
    args: &GetArgs,
    output: &Output,
    template: Option<&Template>,
) -> Result<()> {
    if args.limit.is_some() {
        return Err(Error::usage("--limit does not apply to a watch (-w)"));
    }
    let by_name = match names {
        [] => None,
        [name] if args.selector.is_none() && args.field_selector.is_none() => {
            Some(format!("metadata.name={name}"))
        }
        [_] => {
            return Err(Error::usage(
                "selectors (-l, --field-selector) apply to lists, not to named objects",
            ));
        }
        _ => {
            return Err(Error::usage(
                "a watch (-w) is of a list or of one object, not of several",
            ));
        }
    };
    let mut query = vec![("watch", "true"), ("timeoutSeconds", WATCH_SECONDS)];
    if let Some(selector) = &args.selector {
        query.push(("labelSelector", selector.as_str()));
    }
    if let Some(selector) = by_name.as_ref().or(args.field_selector.as_ref()) {
        query.push(("fieldSelector", selector.as_str()));
    }
    let mut response = client.get_stream(&[kind.plural()], &query).await?;
    let mut buffer = Vec::new();
    let mut initial: Option<Vec<Value>> = Some(Vec::new());
    while let Some(event) = next_event(&mut response, &mut buffer).await {
        let object = event.get("object").cloned().unwrap_or(Value::Null);
        match event.get("type").and_then(Value::as_str) {
            Some("BOOKMARK") => {
                let ends_initial = object
                    .pointer("/metadata/annotations/k8s.io~1initial-events-end")
                    .and_then(Value::as_str)
                    == Some("true");
                if ends_initial && let Some(items) = initial.take() {
                    let document = json!({"apiVersion": "nodus.dev/v1", "kind": format!("{kind}List"), "items": items});
                    let document = match (names, items.as_slice()) {
                        ([_], [one]) => one.clone(),
                        _ => document,
                    };
                    print(kind, output, template, &document, &items, &client.project)?;
                }
            }
            Some("ERROR") => {
                return Err(crate::client::server_error(
                    object
                        .get("code")
                        .and_then(Value::as_u64)
                        .and_then(|code| u16::try_from(code).ok())
                        .unwrap_or(500),
                    object.to_string().as_bytes(),
                ));
            }
            Some(_) => match initial.as_mut() {
                Some(items) => items.push(object),
                None => print_change(kind, output, template, &object)?,
            },
            None => {}
        }
    }
    Ok(())
}

/// The next event of a watch stream; `None` once it has ended.
async fn next_event(response: &mut reqwest::Response, buffer: &mut Vec<u8>) -> Option<Value> {
    loop {
        if let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            match serde_json::from_slice::<Value>(&line) {
                Ok(event) if event.get("type").is_some() => return Some(event),
                _ => continue,
            }
        }
        match response.chunk().await {
            Ok(Some(chunk)) => buffer.extend_from_slice(&chunk),
            _ => return None,
        }
    }
}

/// One change of a watch as `get -w` prints it: a row (the header measured but not
/// printed), or the object in the chosen format.
fn print_change(
    kind: Kind,
    output: &Output,
    template: Option<&Template>,
    object: &Value,
) -> Result<()> {
    match output {
        Output::Table | Output::Wide => {
            let now = jiff::Timestamp::now();
            let table = table::objects(
                kind,
                std::slice::from_ref(object),
                *output == Output::Wide,
                now,
            )
            .render();
            out(table.split_once('\n').map_or("", |(_, rows)| rows));
            Ok(())
        }
        Output::Yaml => {
            out("---\n");
            print(kind, output, template, object, &[], "")
        }
        _ => print(
            kind,
            output,
            template,
            object,
            std::slice::from_ref(object),
            "",
        ),
    }
}

/// A list read in chunks of `chunk` objects (`limit` and `continue`), up to `limit` objects
/// in all when given: the first answer with every object read as its items, and the items.
/// A server that answers whole lists (no `metadata.continue`) is read in one call.
async fn read_list(
    client: &Client,
    kind: Kind,
    selectors: &[(&str, &str)],
    chunk: u64,
    limit: Option<u64>,
) -> Result<(Value, Vec<Value>)> {
    let wanted = limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let mut first: Option<Value> = None;
    let mut items: Vec<Value> = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let left = u64::try_from(wanted - items.len()).unwrap_or(u64::MAX);
        let size = chunk.min(left).to_string();
        let mut query = selectors.to_vec();
        query.push(("limit", size.as_str()));
        if let Some(token) = &token {
            query.push(("continue", token.as_str()));
        }
        let mut answer = client
            .call(Method::GET, &[kind.plural()], &query, None)
            .await?;
        if let Some(Value::Array(more)) = answer.get_mut("items").map(Value::take) {
            items.extend(more);
        }
        token = answer
            .pointer("/metadata/continue")
            .and_then(Value::as_str)
            .map(str::to_string);
        first.get_or_insert(answer);
        if token.is_none() || items.len() >= wanted {
            break;
        }
    }
    items.truncate(wanted);
    let mut document = first.unwrap_or(Value::Null);
    if let Some(metadata) = document.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("continue");
    }
    document["items"] = Value::Array(items.clone());
    Ok((document, items))
}

/// Prints what `get` read in the chosen format.
fn print(
    kind: Kind,
    output: &Output,
    template: Option<&Template>,
    document: &Value,
    items: &[Value],
    project: &str,
) -> Result<()> {
    // As kubectl: the formats for people say so when there is nothing, for every kind.
    if items.is_empty() && matches!(output, Output::Table | Output::Wide | Output::Name) {
        eprintln!("No resources found in project {project}.");
        return Ok(());
    }
    match output {
        Output::Table | Output::Wide => {
            let now = jiff::Timestamp::now();
            out(&table::objects(kind, items, *output == Output::Wide, now).render());
        }
        Output::Yaml => out(&yaml::to_yaml(document)?),
        Output::Json => outln(&serde_json::to_string_pretty(document).unwrap_or_default()),
        Output::Name => {
            for item in items {
                let name = item
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                outln(&qualified(kind, name));
            }
        }
        Output::JsonPath(_) => {
            if let Some(template) = template {
                out(&template.render(document));
            }
        }
    }
    Ok(())
}

/// `nodus get results GROUP`: an evaluation group's per-case results, as a table or in any
/// format `get` prints.
async fn results(client: &Client, args: GetArgs) -> Result<()> {
    let [_, group] = args.targets.as_slice() else {
        return Err(Error::usage(
            "name one evaluation group: nodus get results GROUP",
        ));
    };
    if args.selector.is_some() || args.field_selector.is_some() {
        return Err(Error::usage("results take no selectors"));
    }
    let document = client
        .call(Method::GET, &["agentgroups", group, "results"], &[], None)
        .await?;
    let items = document
        .get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let output = args.output.clone().unwrap_or(Output::Table);
    match &output {
        Output::Table | Output::Wide => {
            if items.is_empty() {
                eprintln!("No results: {group} has no cases (it is not an evaluation group).");
                return Ok(());
            }
            out(&table::results(&items).render());
        }
        Output::Yaml => out(&yaml::to_yaml(&document)?),
        Output::Json => outln(&serde_json::to_string_pretty(&document).unwrap_or_default()),
        Output::Name => {
            for item in &items {
                outln(&qualified(
                    Kind::AgentRun,
                    item.get("run").and_then(Value::as_str).unwrap_or_default(),
                ));
            }
        }
        Output::JsonPath(text) => {
            let template = Template::parse(text).map_err(Error::usage)?;
            out(&template.render(&document));
        }
    }
    Ok(())
}
