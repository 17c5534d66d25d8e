//! An Environment's `spec.network` given to the agents of its evaluations: each run of the
//! evaluation gets its agent's environment with the Environment's network in place of the
//! agent environment's own (snapshotted with the run when the evaluation is submitted, like
//! every run's environment). Graders never get it: their sandbox has no network at all.

use super::{Engine, Result};
use crate::resource::{AgentEnvironmentSpec, AgentSpec, NameOrInline, NetworkSpec};

/// The agent's environment (`None`: it has none) with `network` in place of its own.
pub(super) fn with_network(
    agent_environment: Option<AgentEnvironmentSpec>,
    network: &NetworkSpec,
) -> AgentEnvironmentSpec {
    AgentEnvironmentSpec {
        network: network.clone(),
        ..agent_environment.unwrap_or_default()
    }
}

impl Engine {
    /// The `spec.environment` of the runs of an evaluation in `project` of `agent` on an
    /// Environment whose `spec.network` is `network`: `None` (the agent's environment, as any
    /// run's) when the Environment gives no network, else the agent's environment written
    /// inline with `network` in place of its own.
    pub(super) async fn evaluation_run_environment(
        &self,
        project: &str,
        agent: &AgentSpec,
        network: &NetworkSpec,
    ) -> Result<Option<NameOrInline<AgentEnvironmentSpec>>> {
        if network.is_default() {
            return Ok(None);
        }
        let own = match &agent.environment {
            None => None,
            Some(NameOrInline::Inline(spec)) => Some((**spec).clone()),
            Some(NameOrInline::Name(reference)) => Some(
                self.named_environment(project, reference, "the agent's default")
                    .await?
                    .2,
            ),
        };
        Ok(Some(NameOrInline::Inline(Box::new(with_network(
            own, network,
        )))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{AllowEntry, EgressMode, EnvVar};

    #[test]
    fn the_environment_s_network_replaces_only_the_agent_environment_s_network() {
        let allow = NetworkSpec {
            egress: EgressMode::Allowlist,
            allow: vec![AllowEntry {
                host: Some("files.test".into()),
                cidr: None,
                ports: None,
            }],
            inject: Vec::new(),
        };
        let own = AgentEnvironmentSpec {
            env: vec![EnvVar {
                name: "LOG_LEVEL".into(),
                value: Some("debug".into()),
                value_from: None,
            }],
            ..Default::default()
        };
        let given = with_network(Some(own.clone()), &allow);
        assert_eq!(given.network, allow);
        assert_eq!(given.env, own.env);
        assert_eq!(
            with_network(None, &allow),
            AgentEnvironmentSpec {
                network: allow.clone(),
                ..Default::default()
            }
        );
    }
}
