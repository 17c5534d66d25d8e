//! `nodus patch`, `cancel`, `delete`, `credits` and `completion`.

use nodus_core::resource::Kind;
use reqwest::Method;
use serde_json::{Value, json};

use super::{outln, read_documents};
use crate::cli::{CancelArgs, CompletionArgs, CreditsArgs, CreditsCommand, DeleteArgs, PatchArgs};
use crate::client::{Body, Client};
use crate::error::{Error, Result};
use crate::kinds::{cancellable, parse_target, parse_targets, qualified};
use crate::table::Table;

pub async fn patch(client: &Client, args: PatchArgs) -> Result<()> {
    let (kind, name) = parse_target(&args.target)?;
    let patch = parse_patch(&args.patch)?;
    client
        .call(
            Method::PATCH,
            &[kind.plural(), &name],
            &[],
            Some(Body::MergePatch(patch)),
        )
        .await?;
    outln(&format!("{} patched", qualified(kind, &name)));
    Ok(())
}

/// A merge patch: a JSON object.
pub fn parse_patch(text: &str) -> Result<Value> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::input(format!("--patch is not JSON: {e}")))?;
    if !value.is_object() {
        return Err(Error::input(
            "--patch is a JSON object, such as '{\"spec\":{\"sealed\":true}}'",
        ));
    }
    Ok(value)
}

pub async fn cancel(client: &Client, args: CancelArgs) -> Result<()> {
    let (kind, names) = parse_targets(&args.targets)?;
    if !cancellable(kind) {
        return Err(Error::usage(format!(
            "only agentruns and agentgroups can be cancelled, not {}",
            kind.plural()
        )));
    }
    if names.is_empty() {
        return Err(Error::usage(format!(
            "name the {} to cancel (KIND/NAME or KIND NAME)",
            kind.plural()
        )));
    }
    let mut failures = Vec::new();
    for name in names {
        match client
            .post(&[kind.plural(), &name, "cancel"], json!({}))
            .await
        {
            Ok(_) => outln(&format!("{} cancelled", qualified(kind, &name))),
            Err(error) if error.exit_code() == crate::error::exit::REFUSED => {
                eprintln!("{}", error.render());
                failures.push(error);
            }
            Err(error) => return Err(error),
        }
    }
    super::reported(&failures)
}

pub async fn delete(client: &Client, args: DeleteArgs) -> Result<()> {
    if args.files.is_empty()
        && let Some((kind, names)) = super::access::AccessKind::parse(&args.targets)
    {
        return super::access::delete(client, kind, names, args.ignore_not_found).await;
    }
    // Each target with where it came from (`FILE: document N`) when a file named it.
    let mut targets: Vec<(Option<String>, Kind, String)> = Vec::new();
    let mut failures = Vec::new();
    if !args.files.is_empty() {
        if !args.targets.is_empty() {
            return Err(Error::usage("name objects or give -f files, not both"));
        }
        for (at, document) in read_documents(&args.files)? {
            match super::apply::target(&at, document) {
                Ok((kind, name, _)) => targets.push((Some(at), kind, name)),
                Err(error) => {
                    eprintln!("{}", error.render());
                    failures.push(error);
                }
            }
        }
        // The reverse of apply's order: runs before their group, groups before their agent.
        targets.sort_by_key(|(_, kind, _)| std::cmp::Reverse(kind.apply_rank()));
    } else {
        let (kind, names) = parse_targets(&args.targets)?;
        if names.is_empty() {
            return Err(Error::usage(format!(
                "name the {} to delete (KIND/NAME or KIND NAME)",
                kind.plural()
            )));
        }
        targets.extend(names.into_iter().map(|name| (None, kind, name)));
    }
    // Like kubectl: every object is tried, each failure is reported, and the exit code says
    // that some failed.
    for (at, kind, name) in targets {
        match client
            .call(Method::DELETE, &[kind.plural(), &name], &[], None)
            .await
        {
            Ok(_) => outln(&format!("{} deleted", qualified(kind, &name))),
            Err(error) if error.is_not_found() && args.ignore_not_found => {}
            Err(error) if error.exit_code() != crate::error::exit::REFUSED => return Err(error),
            Err(error) => {
                let error = match &at {
                    Some(at) => super::apply::located(at, error),
                    None => error,
                };
                eprintln!("{}", error.render());
                failures.push(error);
            }
        }
    }
    super::reported(&failures)
}

pub async fn credits(client: &Client, args: CreditsArgs) -> Result<()> {
    let account = match args.command {
        None => client.get(&["credits"]).await?,
        Some(CreditsCommand::Add { amount }) => {
            let amount = amount.trim().trim_start_matches('$').to_string();
            let account = client.post(&["credits"], json!({"addUSD": amount})).await?;
            outln(&format!("added ${amount} to project {}", client.project));
            account
        }
    };
    outln(credits_table(&client.project, &account).render().trim_end());
    Ok(())
}

/// PROJECT, BALANCE, SPENT, RESERVED.
fn credits_table(project: &str, account: &Value) -> Table {
    let amount = |field: &str| {
        account
            .get(field)
            .and_then(Value::as_str)
            .map_or_else(|| "$0.00".to_string(), |a| format!("${a}"))
    };
    let reserved = account
        .get("reserved")
        .and_then(Value::as_object)
        .map_or(0, serde_json::Map::len);
    let mut table = Table::new(&["PROJECT", "BALANCE", "SPENT", "RESERVATIONS"]);
    table.rows.push(vec![
        project.to_string(),
        amount("balanceUSD"),
        amount("spentUSD"),
        reserved.to_string(),
    ]);
    table
}

pub fn completion(args: CompletionArgs) -> Result<()> {
    let mut command = crate::cli::command();
    let mut buffer = Vec::new();
    clap_complete::generate(args.shell, &mut command, "nodus", &mut buffer);
    super::out(&String::from_utf8_lossy(&buffer));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_are_json_objects() {
        assert_eq!(
            parse_patch(r#"{"spec":{"limits":{"maxActive":4}}}"#).expect("valid"),
            json!({"spec": {"limits": {"maxActive": 4}}})
        );
        assert!(parse_patch("[1]").is_err());
        assert!(
            parse_patch("{spec:")
                .expect_err("bad")
                .to_string()
                .starts_with("--patch is not JSON")
        );
    }

    #[test]
    fn credits_show_balance_spend_and_reservations() {
        let account =
            json!({"balanceUSD": "4.98", "spentUSD": "0.02", "reserved": {"u/3": "0.01"}});
        assert_eq!(
            credits_table("default", &account).render(),
            "PROJECT   BALANCE   SPENT   RESERVATIONS\ndefault   $4.98     $0.02   1\n"
        );
    }

    #[test]
    fn completion_scripts_generate_for_each_shell() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut buffer = Vec::new();
            clap_complete::generate(shell, &mut crate::cli::command(), "nodus", &mut buffer);
            let script = String::from_utf8(buffer).expect("utf-8");
            assert!(script.contains("agentrun"), "{shell}");
        }
    }
}
