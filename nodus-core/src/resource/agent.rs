//! The Agent resource: a system prompt, the model access it runs on, and a cost cap.

use serde::{Deserialize, Serialize};

use super::{AgentEnvironmentSpec, NameOrInline};
use crate::catalog::Family;
use crate::money::Usd;

/// `spec` of an Agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSpec {
    /// The system prompt.
    pub system: String,
    /// Which Claude access the agent runs on.
    #[serde(default)]
    pub model: ModelAccess,
    /// Largest output of one model call, in tokens.
    #[serde(default = "AgentSpec::default_max_tokens")]
    pub max_tokens: u32,
    /// What one run may spend on model and routing calls (platform access only).
    #[serde(
        rename = "perRunMaxCostUSD",
        default = "AgentSpec::default_per_run_max_cost"
    )]
    pub per_run_max_cost_usd: Usd,
    /// At most this many commands per turn.
    #[serde(default = "AgentSpec::default_max_tool_calls")]
    pub max_tool_calls: u32,
    /// `Stopped` refuses new runs with `AgentStopped`.
    #[serde(default)]
    pub state: AgentState,
    /// A JSON Schema that a run's `context` must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_schema: Option<serde_json::Value>,
    /// The prompt a run uses when it has no `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_input: Option<String>,
    /// Post-run action kinds a run may choose (default: only `agents.noop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_run_actions: Option<Vec<String>>,
    /// The AgentEnvironment of runs that name none (a stored one's name, or inline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<NameOrInline<AgentEnvironmentSpec>>,
}

impl AgentSpec {
    /// Default `maxTokens`.
    pub const DEFAULT_MAX_TOKENS: u32 = 4096;
    /// Default `maxToolCalls`.
    pub const DEFAULT_MAX_TOOL_CALLS: u32 = 50;
    /// Default `perRunMaxCostUSD`: one dollar.
    pub const DEFAULT_PER_RUN_MAX_COST: Usd = Usd::from_cents(100);

    fn default_max_tokens() -> u32 {
        Self::DEFAULT_MAX_TOKENS
    }
    fn default_per_run_max_cost() -> Usd {
        Self::DEFAULT_PER_RUN_MAX_COST
    }
    fn default_max_tool_calls() -> u32 {
        Self::DEFAULT_MAX_TOOL_CALLS
    }

    /// An agent on Nodus's Claude with every default.
    pub fn new(system: impl Into<String>) -> Self {
        AgentSpec {
            system: system.into(),
            model: ModelAccess::default(),
            max_tokens: Self::DEFAULT_MAX_TOKENS,
            per_run_max_cost_usd: Self::DEFAULT_PER_RUN_MAX_COST,
            max_tool_calls: Self::DEFAULT_MAX_TOOL_CALLS,
            state: AgentState::Running,
            context_schema: None,
            default_input: None,
            post_run_actions: None,
            environment: None,
        }
    }
}

/// `spec.model`: whose Claude the agent uses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelAccess {
    /// `Nodus` (billed from credits, routed) or `BYOK` (the user's own key).
    #[serde(default)]
    pub access: Access,
    /// Restricts the router's choice (platform access).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub families: Option<Vec<Family>>,
    /// The model id (required for BYOK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The Secret holding the provider key (BYOK), under the key the server names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret: Option<String>,
}

/// Whose account pays for the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum Access {
    /// Nodus's Claude: routed per prompt, billed from the project's credits.
    #[default]
    Nodus,
    /// The user's own provider key: not billed by Nodus, no cap.
    #[serde(rename = "BYOK")]
    Byok,
}

/// Whether an agent accepts new runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum AgentState {
    /// Accepts runs.
    #[default]
    Running,
    /// Refuses new runs with `AgentStopped`.
    Stopped,
}

/// `status` of an Agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {}
