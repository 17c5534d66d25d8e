//! A test sandbox made of the recording sandbox and what a test does around its calls.

use std::sync::Arc;

use async_trait::async_trait;
use nodus_core::sandbox::{
    Error, ExecOutput, ExecRequest, Sandbox, SandboxId, SandboxInfo, SandboxSpec,
};
use nodus_core::testing::RecordingSandbox;

/// What a test does around the recording sandbox's calls, each given the recording sandbox to
/// call (or not): by default, only that call.
#[async_trait]
pub trait Hooks: Send + Sync + 'static {
    /// A command.
    async fn exec(
        &self,
        inner: &RecordingSandbox,
        id: &SandboxId,
        request: &ExecRequest,
    ) -> Result<ExecOutput, Error> {
        inner.exec(id, request).await
    }

    /// Files read out of the sandbox.
    async fn get_files(
        &self,
        inner: &RecordingSandbox,
        id: &SandboxId,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, Error> {
        inner.get_files(id, path, max_bytes).await
    }

    /// The sandbox deleted.
    async fn destroy(&self, inner: &RecordingSandbox, id: &SandboxId) -> Result<(), Error> {
        inner.destroy(id).await
    }
}

/// The recording sandbox `inner` (a world's, say) with a test's `hooks` around its calls.
pub struct Hooked<H> {
    pub inner: Arc<RecordingSandbox>,
    pub hooks: H,
}

#[async_trait]
impl<H: Hooks> Sandbox for Hooked<H> {
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error> {
        self.inner.create(spec).await
    }

    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error> {
        self.hooks.exec(&self.inner, id, request).await
    }

    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error> {
        self.inner.put_files(id, tar).await
    }

    async fn get_files(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, Error> {
        self.hooks.get_files(&self.inner, id, path, max_bytes).await
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), Error> {
        self.hooks.destroy(&self.inner, id).await
    }
}
