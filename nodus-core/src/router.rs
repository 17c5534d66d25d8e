//! The `Router` trait: picks a model family per prompt. The built-in router `jev` lives in
//! nodus-llm; [`FixedRouter`] always answers one family.

use async_trait::async_trait;

use crate::catalog::Family;
use crate::cost::Usage;
use crate::model::ChatMessage;
use crate::money::Usd;

/// What the router sees.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// The prompt of the turn.
    pub prompt: &'a str,
    /// The conversation before it.
    pub conversation: &'a [ChatMessage],
    /// The families it may choose (the agent's `families`, or every family).
    pub allowed: &'a [Family],
}

/// A call the router made to a model to decide, billed as a routing call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingCall {
    /// The model it asked.
    pub model: String,
    /// What that call used.
    pub usage: Usage,
}

/// The router's choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteChoice {
    /// The family that answers the whole turn.
    pub family: Family,
    /// The model call the router made, if it made one.
    pub call: Option<RoutingCall>,
}

/// Why routing failed (the turn then goes to the fallback family).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("routing failed: {0}")]
pub struct Error(pub String);

/// Picks a family per prompt.
#[async_trait]
pub trait Router: Send + Sync {
    /// The most one routing call can cost (zero for a local router); reserved under the
    /// run's cap before routing.
    fn max_cost(&self) -> Usd {
        Usd::ZERO
    }

    /// Choose a family among `request.allowed`.
    async fn route(&self, request: &RouteRequest<'_>) -> Result<RouteChoice, Error>;
}

/// A router that always prefers one family (the first allowed one when it is not allowed).
#[derive(Debug, Clone, Copy)]
pub struct FixedRouter(pub Family);

#[async_trait]
impl Router for FixedRouter {
    async fn route(&self, request: &RouteRequest<'_>) -> Result<RouteChoice, Error> {
        let family = if request.allowed.contains(&self.0) {
            self.0
        } else {
            *request
                .allowed
                .first()
                .ok_or_else(|| Error("no family is allowed".to_string()))?
        };
        Ok(RouteChoice { family, call: None })
    }
}
