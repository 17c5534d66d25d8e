//! What every handler shares: the engine, the store, tokens, the cipher, credits, counters,
//! waiting watches and admission. A leaf: the API, the console and the streams read it;
//! only `app` builds it.

use std::sync::Arc;

use nodus_core::engine::Engine;
use nodus_core::ledger::StoreLedger;
use nodus_core::store::Store;

use crate::auth::Auth;
use crate::metrics::Metrics;
use crate::secrets::Cipher;

/// What every handler shares.
pub struct AppState {
    /// The run engine.
    pub engine: Engine,
    /// The store.
    pub store: Arc<dyn Store>,
    /// Tokens.
    pub auth: Auth,
    /// Seals Secret values.
    pub cipher: Cipher,
    /// Project credits.
    pub ledger: StoreLedger,
    /// Request counters.
    pub metrics: Metrics,
    /// The long polls and watch streams waiting for a change; they end when the server
    /// stops.
    pub watches: crate::watch::Watches,
    /// What request bodies and streams may hold, and who holds what.
    pub admission: Arc<crate::admission::Admission>,
}
