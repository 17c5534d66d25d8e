//! Projects and tokens: `nodus create project|token`, `nodus get projects|tokens`,
//! `nodus delete token`. A token's secret is printed once, by `create token`, and never
//! again.

use reqwest::Method;
use serde_json::{Value, json};

use super::{out, outln};
use crate::cli::{CreateProjectArgs, CreateTokenArgs, GetArgs, Output};
use crate::client::{Body, Client};
use crate::error::{Error, Result};
use crate::jsonpath::Template;
use crate::table::{self, Table};
use crate::yaml;

/// The path segments of `/apis/nodus.dev/v1/projects`.
pub const PROJECTS: [&str; 4] = ["apis", "nodus.dev", "v1", "projects"];

/// Projects and tokens: the kinds this module answers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    /// Projects.
    Project,
    /// Tokens.
    Token,
}

impl AccessKind {
    /// The kind a `get`/`delete` argument names (`projects`, `token/ci`), with the names.
    pub fn parse(arguments: &[String]) -> Option<(AccessKind, Vec<String>)> {
        let kind_of = |text: &str| match text.to_ascii_lowercase().as_str() {
            "project" | "projects" => Some(AccessKind::Project),
            "token" | "tokens" => Some(AccessKind::Token),
            _ => None,
        };
        let first = arguments.first()?;
        if let Some((kind, _)) = first.split_once('/') {
            let kind = kind_of(kind)?;
            let names = arguments
                .iter()
                .map(|a| {
                    a.split_once('/')
                        .and_then(|(k, n)| (kind_of(k) == Some(kind)).then(|| n.to_string()))
                })
                .collect::<Option<Vec<_>>>()?;
            return Some((kind, names));
        }
        Some((kind_of(first)?, arguments[1..].to_vec()))
    }

    fn singular(self) -> &'static str {
        match self {
            AccessKind::Project => "project",
            AccessKind::Token => "token",
        }
    }
}

/// `nodus create project NAME` (the operator token).
pub async fn create_project(client: &Client, args: CreateProjectArgs) -> Result<()> {
    let created = client
        .send(
            Method::POST,
            &PROJECTS,
            &[],
            Some(Body::Json(json!({"apiVersion": "nodus.dev/v1", "kind": "Project", "metadata": {"name": args.name}}))),
            &[],
        )
        .await?;
    let name = created["metadata"]["name"].as_str().unwrap_or_default();
    outln(&format!("project/{name} created"));
    Ok(())
}

/// `nodus create token NAME --role R [--expires 30d]` in the project: the secret alone on
/// standard output (so that `TOKEN=$(nodus create token …)` keeps it), what was made on
/// standard error.
pub async fn create_token(client: &Client, args: CreateTokenArgs) -> Result<()> {
    let mut spec = json!({"role": args.role.name()});
    if let Some(expires) = &args.expires {
        spec["expires"] = json!(expires);
    }
    let created = client
        .post(
            &["tokens"],
            json!({"apiVersion": "nodus.dev/v1", "kind": "Token", "metadata": {"name": args.name}, "spec": spec}),
        )
        .await?;
    let secret = created["token"]
        .as_str()
        .ok_or_else(|| Error::Start("the server answered no token".to_string()))?;
    let expiry = created["spec"]["expiresAt"]
        .as_str()
        .map(|at| format!(", expires {at}"))
        .unwrap_or_default();
    eprintln!(
        "token/{} created in project {} (role {}{expiry}); it is shown this once:",
        created["metadata"]["name"].as_str().unwrap_or_default(),
        client.project,
        args.role.name()
    );
    outln(secret);
    Ok(())
}

/// `nodus get projects|tokens [NAME…]`.
pub async fn get(
    client: &Client,
    kind: AccessKind,
    names: Vec<String>,
    args: GetArgs,
) -> Result<()> {
    if args.selector.is_some() || args.field_selector.is_some() {
        return Err(Error::usage(format!(
            "selectors (-l, --field-selector) do not apply to {}s",
            kind.singular()
        )));
    }
    let output = args.output.unwrap_or(Output::Table);
    let template = match &output {
        Output::JsonPath(text) => Some(Template::parse(text).map_err(Error::usage)?),
        _ => None,
    };
    let list = match kind {
        AccessKind::Project => client.send(Method::GET, &PROJECTS, &[], None, &[]).await?,
        AccessKind::Token => client.get(&["tokens"]).await?,
    };
    let mut items: Vec<Value> = list["items"].as_array().cloned().unwrap_or_default();
    let mut failures = Vec::new();
    if !names.is_empty() {
        items.retain(|item| names.iter().any(|n| item["metadata"]["name"] == n.as_str()));
        for name in &names {
            if !items
                .iter()
                .any(|item| item["metadata"]["name"] == name.as_str())
            {
                let error = Error::Server {
                    code: 404,
                    reason: nodus_core::engine::Reason::NotFound,
                    message: format!("{} {name:?} not found", kind.singular()),
                };
                eprintln!("{}", error.render());
                failures.push(error);
            }
        }
        if items.is_empty() {
            return super::reported(&failures);
        }
    }
    let document = match (names.len(), items.as_slice()) {
        (1, [one]) => one.clone(),
        _ => json!({"apiVersion": "nodus.dev/v1", "kind": list["kind"], "items": items}),
    };
    if items.is_empty() && matches!(output, Output::Table | Output::Wide | Output::Name) {
        match kind {
            AccessKind::Project => eprintln!("No projects found."),
            AccessKind::Token => eprintln!("No tokens found in project {}.", client.project),
        }
        return super::reported(&failures);
    }
    match output {
        Output::Table | Output::Wide => {
            out(&render(kind, &items, output == Output::Wide, jiff::Timestamp::now()).render())
        }
        Output::Yaml => out(&yaml::to_yaml(&document)?),
        Output::Json => outln(&serde_json::to_string_pretty(&document).unwrap_or_default()),
        Output::Name => {
            for item in &items {
                outln(&format!(
                    "{}/{}",
                    kind.singular(),
                    item["metadata"]["name"].as_str().unwrap_or_default()
                ));
            }
        }
        Output::JsonPath(_) => {
            if let Some(template) = template {
                out(&template.render(&document));
            }
        }
    }
    super::reported(&failures)
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

/// The table of projects (NAME) or tokens (NAME, PROJECTS, ROLE, EXPIRES, AGE; with `wide`,
/// the times of expiry and creation too).
fn render(kind: AccessKind, items: &[Value], wide: bool, now: jiff::Timestamp) -> Table {
    match kind {
        AccessKind::Project => {
            let mut table = Table::new(&["NAME"]);
            for item in items {
                table.rows.push(vec![text(&item["metadata"]["name"])]);
            }
            table
        }
        AccessKind::Token => {
            let mut headers = vec!["NAME", "PROJECTS", "ROLE", "EXPIRES", "AGE"];
            if wide {
                headers.extend(["EXPIRES-AT", "CREATED"]);
            }
            let mut table = Table::new(&headers);
            for item in items {
                let projects: Vec<String> = item["spec"]["projects"]
                    .as_array()
                    .map(|p| p.iter().map(text).collect())
                    .unwrap_or_default();
                let mut role = text(&item["spec"]["role"]);
                if item["spec"]["operator"] == true {
                    role.push_str(" (operator)");
                }
                let since = |field: &Value| {
                    field
                        .as_str()
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .map(|t| t.as_second() - now.as_second())
                };
                let expires = match since(&item["spec"]["expiresAt"]) {
                    None => "never".to_string(),
                    Some(left) if left <= 0 => "expired".to_string(),
                    Some(left) => format!("in {}", table::human_duration(left)),
                };
                let age = since(&item["metadata"]["creationTimestamp"])
                    .map(|ago| table::human_duration(-ago))
                    .unwrap_or_default();
                let mut row = vec![
                    text(&item["metadata"]["name"]),
                    projects.join(","),
                    role,
                    expires,
                    age,
                ];
                if wide {
                    let at = text(&item["spec"]["expiresAt"]);
                    row.push(if at.is_empty() {
                        "<none>".to_string()
                    } else {
                        at
                    });
                    row.push(text(&item["metadata"]["creationTimestamp"]));
                }
                table.rows.push(row);
            }
            table
        }
    }
}

/// `nodus delete token NAME…`: each is refused from its next request on.
pub async fn delete(
    client: &Client,
    kind: AccessKind,
    names: Vec<String>,
    ignore_not_found: bool,
) -> Result<()> {
    if kind == AccessKind::Project {
        return Err(Error::usage("projects cannot be deleted"));
    }
    if names.is_empty() {
        return Err(Error::usage(
            "name the tokens to delete (token NAME or token/NAME)",
        ));
    }
    let mut failures = Vec::new();
    for name in names {
        match client
            .call(Method::DELETE, &["tokens", &name], &[], None)
            .await
        {
            Ok(_) => outln(&format!("token/{name} deleted")),
            Err(error) if error.is_not_found() && ignore_not_found => {}
            Err(error) if error.exit_code() != crate::error::exit::REFUSED => return Err(error),
            Err(error) => {
                eprintln!("{}", error.render());
                failures.push(error);
            }
        }
    }
    super::reported(&failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_kinds_parse() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            AccessKind::parse(&args(&["projects"])),
            Some((AccessKind::Project, vec![]))
        );
        assert_eq!(
            AccessKind::parse(&args(&["token", "ci"])),
            Some((AccessKind::Token, vec!["ci".to_string()]))
        );
        assert_eq!(
            AccessKind::parse(&args(&["token/ci", "tokens/cd"])),
            Some((AccessKind::Token, vec!["ci".to_string(), "cd".to_string()]))
        );
        assert_eq!(AccessKind::parse(&args(&["agentruns"])), None);
        assert_eq!(AccessKind::parse(&args(&["token/ci", "agent/x"])), None);
    }
}
