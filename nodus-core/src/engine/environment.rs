//! A run's AgentEnvironment: resolved when the run is created (a missing environment, Secret
//! or key, a reserved name, a GPU the sandbox cannot give fail the request) and snapshotted
//! with its Secrets by name and version; turned into its sandbox's environment and limits
//! when the sandbox is created. The Secrets' values are read when the run is created too and
//! pinned: sealed into the run's private document (its [`Kind::WorkdirArchive`], as
//! `pinnedSecrets`, deleted with the run and by retention), so that changing or deleting a
//! Secret afterwards does not change the run. They are opened only to be handed to the
//! sandbox (and to the post-run action that reads one, and to the egress proxy for the headers
//! `spec.network.inject` adds, which the sandbox never sees): the journaled sandbox spec holds
//! the plain variables only.

use std::collections::BTreeMap;

use super::{Engine, Error, Result, typed};
use crate::resource::{
    AgentEnvironmentSpec, AgentRunSpec, AgentSpec, EnvironmentSnapshot, Kind, NameOrInline,
    NetworkSpec, SecretKeyRef, SecretVersion,
};
use crate::sandbox::{Limits, SandboxSpec};
use crate::secret::{PinnedSecrets, SecretString};
use crate::store::{self, ObjectKey};
use crate::validate::Invalid;

const FIELD: &str = "spec.environment";

/// The name of the AgentEnvironment `reference` names in `project` (`NAME`, or
/// `PROJECT/NAME` of this very project), or `None` when it names another project's, which
/// nothing in `project` may reach.
fn own_name<'a>(project: &str, reference: &'a str) -> Option<&'a str> {
    match reference.split_once('/') {
        None => Some(reference),
        Some((named, name)) => (named == project).then_some(name),
    }
}

/// An Agent of `project` may name only an AgentEnvironment of `project` (or hold one
/// inline): the rule a run's creation applies, checked when the Agent is written.
pub(super) fn check_reference(
    project: &str,
    environment: Option<&NameOrInline<AgentEnvironmentSpec>>,
) -> Result<()> {
    let Some(NameOrInline::Name(reference)) = environment else {
        return Ok(());
    };
    if own_name(project, reference).is_some() {
        return Ok(());
    }
    Err(Invalid::new(
        FIELD,
        format!(
            "must name an AgentEnvironment of this project ({project:?}), as NAME or \
             {project}/NAME, or hold one inline: another project's is never reachable"
        ),
        format!("{reference:?}"),
    )
    .into())
}

impl Engine {
    /// Resolve the run's `spec.environment`, or its agent's `environment` when it names
    /// none, into what the run keeps: the spec and the version of every Secret it reads,
    /// whose values are added to `pinned`.
    pub(super) async fn resolve_environment(
        &self,
        project: &str,
        run: &AgentRunSpec,
        agent: &AgentSpec,
        pinned: &mut PinnedSecrets,
    ) -> Result<Option<EnvironmentSnapshot>> {
        let (chosen, whose) = match (&run.environment, &agent.environment) {
            (Some(chosen), _) => (chosen, "the run's"),
            (None, Some(chosen)) => (chosen, "the agent's default"),
            (None, None) => return Ok(None),
        };
        let (environment_ref, environment_revision, spec) = match chosen {
            NameOrInline::Inline(spec) => (None, None, (**spec).clone()),
            NameOrInline::Name(reference) => {
                let (reference, revision, spec) =
                    self.named_environment(project, reference, whose).await?;
                (Some(reference), Some(revision), spec)
            }
        };
        let mut secrets: Vec<SecretVersion> = Vec::new();
        for (index, var) in spec.env.iter().enumerate() {
            let Some(from) = &var.value_from else {
                continue;
            };
            let secret = &from.secret_key_ref;
            let field = format!("{FIELD}.env[{index}].valueFrom.secretKeyRef");
            let version = self
                .pin_secret(project, &field, secret, whose, pinned)
                .await?;
            if !secrets.iter().any(|s| s.name == secret.name) {
                secrets.push(SecretVersion {
                    name: secret.name.clone(),
                    resource_version: version,
                });
            }
        }
        for (index, entry) in spec.network.inject.iter().enumerate() {
            let secret = &entry.value_from.secret_key_ref;
            let field = format!("{FIELD}.network.inject[{index}].valueFrom.secretKeyRef");
            let version = self
                .pin_secret(project, &field, secret, whose, pinned)
                .await?;
            // The value travels in a request's header: one that could not (a line break
            // would add headers of its own) is refused now, without being shown.
            if !pinned
                .get(&secret.name, &secret.key)
                .is_some_and(|value| crate::egress::valid_header_value(value.expose()))
            {
                return Err(Invalid::new(
                    field,
                    format!(
                        "must name a key whose value is fit for an HTTP header: not empty, \
                         visible ASCII, spaces and tabs only ({whose})"
                    ),
                    format!(
                        "Secret {:?} key {:?} (its value is not shown)",
                        secret.name, secret.key
                    ),
                )
                .into());
            }
            if !secrets.iter().any(|s| s.name == secret.name) {
                secrets.push(SecretVersion {
                    name: secret.name.clone(),
                    resource_version: version,
                });
            }
        }
        if let Some(gpus) = spec.compute.as_ref().and_then(|c| c.gpu)
            && gpus > 0
            && !self.deps.sandbox.supports_gpu()
        {
            return Err(Invalid::new(
                format!("{FIELD}.compute.nvidia.com/gpu"),
                format!(
                    "cannot be given by this server's sandbox backend, which has no GPUs to \
                     hand out ({whose}): ask for 0 or leave it out"
                ),
                gpus.to_string(),
            )
            .into());
        }
        self.check_network(&spec.network, whose)?;
        Ok(Some(EnvironmentSnapshot {
            environment_ref,
            environment_revision,
            spec,
            secrets,
        }))
    }

    /// The AgentEnvironment `reference` names in `project` (`whose` reference it is, for the
    /// refusal): its `project/name`, its revision and its spec.
    pub(super) async fn named_environment(
        &self,
        project: &str,
        reference: &str,
        whose: &str,
    ) -> Result<(String, String, AgentEnvironmentSpec)> {
        let missing = || -> Error {
            Invalid::new(
                FIELD,
                format!("must name an existing AgentEnvironment of this project ({whose})"),
                format!("{reference:?}"),
            )
            .into()
        };
        // Another project's environment is answered as missing: a run learns nothing of it.
        let Some(name) = own_name(project, reference) else {
            return Err(missing());
        };
        let key = ObjectKey::new(project, Kind::AgentEnvironment, name);
        let record = match self.deps.store.get(&key).await {
            Ok(record) => record,
            Err(store::Error::NotFound(_)) => return Err(missing()),
            Err(e) => return Err(e.into()),
        };
        let stored = typed::decode::<AgentEnvironmentSpec>(record)?;
        Ok((
            format!("{project}/{name}"),
            stored.version.to_string(),
            stored.object.spec,
        ))
    }

    /// The rules of `spec.network` that depend on the server: a `cidr` only inside the
    /// operator's `--egress-allow`, and an `allowlist` only where the sandbox backend can
    /// route a sandbox to the egress proxy (default-deny: a run is refused rather than started
    /// without the way out it asked for).
    fn check_network(&self, network: &crate::resource::NetworkSpec, whose: &str) -> Result<()> {
        for (index, entry) in network.allow.iter().enumerate() {
            let Some(text) = &entry.cidr else {
                continue;
            };
            let inside = text
                .parse::<crate::egress::Cidr>()
                .is_ok_and(|cidr| cidr.inside(&self.config.egress_allow));
            if !inside {
                let allowed: Vec<String> = self
                    .config
                    .egress_allow
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                return Err(Invalid::new(
                    format!("{FIELD}.network.allow[{index}].cidr"),
                    format!(
                        "must lie inside a network the server's --egress-allow lists ({}) \
                         ({whose})",
                        if allowed.is_empty() {
                            "none".to_string()
                        } else {
                            allowed.join(", ")
                        }
                    ),
                    text.clone(),
                )
                .into());
            }
        }
        if network.egress == crate::resource::EgressMode::Allowlist
            && !self.deps.sandbox.supports_egress()
        {
            return Err(Invalid::new(
                format!("{FIELD}.network.egress"),
                format!(
                    "allowlist cannot be given by this server's sandbox backend, which has no \
                     route to the egress proxy ({whose}): use none, or a server whose sandboxes \
                     can reach it (process sandboxes started by the nodus launcher, Docker \
                     containers on the server's own engine)"
                ),
                "allowlist",
            )
            .into());
        }
        Ok(())
    }

    /// Read key `secret.key` of Secret `secret.name` into `pinned`; the Secret's version. A
    /// missing Secret or key fails the request, naming `field` (`whose` reference it is).
    async fn pin_secret(
        &self,
        project: &str,
        field: &str,
        secret: &SecretKeyRef,
        whose: &str,
        pinned: &mut PinnedSecrets,
    ) -> Result<String> {
        let absent = || -> Error {
            Invalid::new(
                field,
                format!("must name a Secret of this project that holds the key ({whose})"),
                format!("Secret {:?} key {:?}", secret.name, secret.key),
            )
            .into()
        };
        let key = ObjectKey::new(project, Kind::Secret, &secret.name);
        let version = match self.deps.store.get(&key).await {
            Ok(record) => record.version.to_string(),
            Err(store::Error::NotFound(_)) => return Err(absent()),
            Err(e) => return Err(e.into()),
        };
        match self
            .deps
            .secrets
            .lookup(project, &secret.name, &secret.key)
            .await
        {
            Some(value) => pinned.insert(&secret.name, &secret.key, value),
            None => return Err(absent()),
        }
        Ok(version)
    }

    /// Pin the Secret values the run's post-run action reads (its config's references, as
    /// the action names them), failing the request naming the field of one that is missing.
    pub(super) async fn pin_action_secrets(
        &self,
        project: &str,
        action: &crate::postrun::Chosen,
        pinned: &mut PinnedSecrets,
    ) -> Result<()> {
        let Some(installed) = self.config.actions.get(&action.kind) else {
            return Ok(());
        };
        for (field, secret) in installed.secret_refs(&action.config) {
            let field = format!("spec.postRunAction.config{field}");
            self.pin_secret(project, &field, &secret, "the post-run action's", pinned)
                .await?;
        }
        Ok(())
    }

    /// The Secret values pinned when the run `run` was created (none for a run created
    /// before values were pinned, or whose private document retention removed). An error
    /// (without any value) when they cannot be opened.
    pub(super) async fn pinned_secrets(
        &self,
        run: &ObjectKey,
    ) -> std::result::Result<PinnedSecrets, String> {
        let record = match self.deps.store.get(&super::workdir_archive_key(run)).await {
            Ok(record) => record,
            Err(store::Error::NotFound(_)) => return Ok(PinnedSecrets::new()),
            Err(e) => return Err(format!("cannot read the run's pinned Secret values: {e}")),
        };
        match record
            .document
            .get("pinnedSecrets")
            .and_then(|v| v.as_str())
        {
            Some(sealed) => PinnedSecrets::open(sealed, self.deps.secrets.as_ref())
                .map_err(|e| format!("cannot open the run's pinned Secret values: {e}")),
            None => Ok(PinnedSecrets::new()),
        }
    }

    /// `spec` with the values of the environment's Secrets added to its variables: those
    /// pinned when the run `run` was created (a run created before values were pinned reads
    /// the Secret now). They are kept nowhere else; an error (without any value) when one
    /// cannot be had.
    pub(super) async fn with_secrets(
        &self,
        run: &ObjectKey,
        environment: Option<&EnvironmentSnapshot>,
        spec: &SandboxSpec,
    ) -> std::result::Result<SandboxSpec, String> {
        let mut spec = spec.clone();
        for (name, value) in self.secret_env(run, environment).await? {
            spec.env.insert(name, value.expose().to_string());
        }
        if spec.egress.is_some() {
            spec.egress_headers = self.injected_headers(run, environment).await?;
        }
        Ok(spec)
    }

    /// The variables of the environment that read a Secret, with their values
    /// ([`Engine::with_secrets`]).
    pub(super) async fn secret_env(
        &self,
        run: &ObjectKey,
        environment: Option<&EnvironmentSnapshot>,
    ) -> std::result::Result<Vec<(String, SecretString)>, String> {
        let Some(environment) = environment else {
            return Ok(Vec::new());
        };
        if !environment
            .spec
            .env
            .iter()
            .any(|var| var.value_from.is_some())
        {
            return Ok(Vec::new());
        }
        let pinned = self.pinned_secrets(run).await?;
        let mut values = Vec::new();
        for var in &environment.spec.env {
            let Some(from) = &var.value_from else {
                continue;
            };
            let secret = &from.secret_key_ref;
            let value = self
                .pinned_or_now(run, &pinned, secret)
                .await
                .ok_or_else(|| {
                    format!(
                        "the environment variable {} reads key {:?} of Secret {:?}, which was not \
                     pinned when the run was created and is gone now",
                        var.name, secret.key, secret.name
                    )
                })?;
            values.push((var.name.clone(), value));
        }
        Ok(values)
    }

    /// The headers the environment's `spec.network.inject` has the egress proxy add, with
    /// their values ([`Engine::with_secrets`]).
    pub(super) async fn injected_headers(
        &self,
        run: &ObjectKey,
        environment: Option<&EnvironmentSnapshot>,
    ) -> std::result::Result<Vec<crate::egress::InjectedHeader>, String> {
        let Some(environment) = environment.filter(|e| !e.spec.network.inject.is_empty()) else {
            return Ok(Vec::new());
        };
        let pinned = self.pinned_secrets(run).await?;
        let mut headers = Vec::new();
        for entry in &environment.spec.network.inject {
            let secret = &entry.value_from.secret_key_ref;
            let value = self
                .pinned_or_now(run, &pinned, secret)
                .await
                .ok_or_else(|| {
                    format!(
                        "the header {} for {} reads key {:?} of Secret {:?}, which was not pinned \
                     when the run was created and is gone now",
                        entry.header, entry.host, secret.key, secret.name
                    )
                })?;
            headers.push(crate::egress::InjectedHeader {
                host: entry.host.clone(),
                name: entry.header.clone(),
                value,
            });
        }
        Ok(headers)
    }

    /// The value of `secret` pinned for run `run`, or (for a run created before values were
    /// pinned) the Secret's value now.
    async fn pinned_or_now(
        &self,
        run: &ObjectKey,
        pinned: &PinnedSecrets,
        secret: &SecretKeyRef,
    ) -> Option<SecretString> {
        match pinned.get(&secret.name, &secret.key) {
            Some(value) => Some(value.clone()),
            None => {
                self.deps
                    .secrets
                    .lookup(&run.project, &secret.name, &secret.key)
                    .await
            }
        }
    }

    /// What the spans of run `run` may disclose: `None` when message content is not exported,
    /// or when the values of the Secrets its environment reads cannot be had (its spans then
    /// carry no content rather than risk one); else those values, to hide.
    pub(super) async fn hidden_in_spans(
        &self,
        run: &ObjectKey,
        environment: Option<&EnvironmentSnapshot>,
    ) -> Option<crate::telemetry::Hidden> {
        if !self.deps.spans.enabled() || self.deps.spans.content() != crate::telemetry::Content::On
        {
            return None;
        }
        let values = match self.secret_env(run, environment).await {
            Ok(values) => self
                .injected_headers(run, environment)
                .await
                .map(|headers| (values, headers)),
            Err(error) => Err(error),
        };
        match values {
            Ok((values, headers)) => Some(crate::telemetry::Hidden::new(
                values
                    .into_iter()
                    .map(|(_, value)| value)
                    .chain(headers.into_iter().map(|header| header.value)),
            )),
            Err(error) => {
                tracing::warn!(run = %run, error = %error, "exporting the run's spans without content: its Secrets' values, which spans must hide, cannot be read");
                None
            }
        }
    }
}

/// The plain variables of an environment (its Secrets are added only when the sandbox is
/// created, see [`Engine::with_secrets`]).
pub(super) fn plain_env(environment: Option<&EnvironmentSnapshot>) -> BTreeMap<String, String> {
    environment
        .into_iter()
        .flat_map(|e| &e.spec.env)
        .filter_map(|var| Some((var.name.clone(), var.value.clone()?)))
        .collect()
}

/// The allowlist the egress proxy applies to the run's sandbox: the environment's
/// `spec.network` when it is `egress: allowlist`; `None` (no way out at all) otherwise.
pub(super) fn egress_of(environment: Option<&EnvironmentSnapshot>) -> Option<NetworkSpec> {
    environment
        .map(|e| &e.spec.network)
        .filter(|network| network.egress == crate::resource::EgressMode::Allowlist)
        .cloned()
}

/// The server's limits with the environment's compute in place of its CPU and memory.
pub(super) fn limits_of(base: Limits, environment: Option<&EnvironmentSnapshot>) -> Limits {
    let mut limits = base;
    let Some(compute) = environment.and_then(|e| e.spec.compute.as_ref()) else {
        return limits;
    };
    if let Some(millis) = compute.cpu.as_ref().and_then(|cpu| cpu.cpu_millis()) {
        limits.cpu_millis = u32::try_from(millis).unwrap_or(u32::MAX);
    }
    if let Some(bytes) = compute.memory.as_ref().and_then(|memory| memory.bytes()) {
        limits.memory_bytes = bytes;
    }
    limits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{Compute, EnvVar, EnvVarSource, Quantity, SecretKeyRef};

    fn snapshot() -> EnvironmentSnapshot {
        EnvironmentSnapshot {
            environment_ref: None,
            environment_revision: None,
            spec: AgentEnvironmentSpec {
                env: vec![
                    EnvVar {
                        name: "LOG_LEVEL".into(),
                        value: Some("debug".into()),
                        value_from: None,
                    },
                    EnvVar {
                        name: "TOKEN".into(),
                        value: None,
                        value_from: Some(EnvVarSource {
                            secret_key_ref: SecretKeyRef {
                                name: "github".into(),
                                key: "token".into(),
                            },
                        }),
                    },
                ],
                compute: Some(Compute {
                    cpu: Some(Quantity("500m".into())),
                    memory: Some(Quantity("256Mi".into())),
                    gpu: None,
                }),
                network: Default::default(),
            },
            secrets: Vec::new(),
        }
    }

    #[test]
    fn compute_replaces_cpu_and_memory_and_keeps_the_rest() {
        let base = Limits::default();
        let limits = limits_of(base, Some(&snapshot()));
        assert_eq!(limits.cpu_millis, 500);
        assert_eq!(limits.memory_bytes, 256 << 20);
        assert_eq!(limits.processes, base.processes);
        assert_eq!(limits.command_timeout_secs, base.command_timeout_secs);
        assert_eq!(limits_of(base, None), base);
    }

    #[test]
    fn only_plain_values_are_in_the_journaled_environment() {
        let env = plain_env(Some(&snapshot()));
        assert_eq!(
            env,
            BTreeMap::from([("LOG_LEVEL".to_string(), "debug".to_string())])
        );
        assert!(plain_env(None).is_empty());
    }
}
