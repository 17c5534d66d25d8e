//! Images pinned when runs are created: a run's image reference (its `spec.image`, or the
//! server's default image) is resolved once, through the sandbox backend, to the content
//! digest its sandbox then runs, so that moving a tag afterwards changes nothing for a run
//! already created, nor for the members of an evaluation group created together.

use std::collections::HashMap;

use super::{Engine, Error, Result};
use crate::validate::Invalid;

/// Image references resolved while one request creates its runs, with their digests: each
/// reference is resolved once per request, so that all its runs run the same image.
pub(super) type PinnedImages = HashMap<String, String>;

impl Engine {
    /// The content digest the sandbox of a run whose `spec.image` is `named` runs: that
    /// image, or the server's default one, resolved ([`Engine::resolve_image`]) unless
    /// `pinned` holds it already; `None` when the backend runs no images or no image is
    /// named anywhere (the backend then uses its own default). Errors name `spec.image`.
    pub(super) async fn pin_image(
        &self,
        named: Option<&str>,
        pinned: &mut PinnedImages,
    ) -> Result<Option<String>> {
        if !self.deps.sandbox.supports_image() {
            return Ok(None);
        }
        let Some(reference) = named.or(self.config.default_image.as_deref()) else {
            return Ok(None);
        };
        if let Some(digest) = pinned.get(reference) {
            return Ok(Some(digest.clone()));
        }
        let rule = if named.is_some() {
            "must name an image this server's sandbox backend can run"
        } else {
            "is not set, and the server's default image cannot be run"
        };
        let digest = self.resolve_image(reference, "spec.image", rule).await?;
        pinned.insert(reference.to_owned(), digest.clone());
        Ok(Some(digest))
    }

    /// `reference` resolved by the sandbox backend to the content digest of the image it
    /// names now ([`Sandbox::resolve_image`](crate::sandbox::Sandbox::resolve_image)). An
    /// image the backend cannot get is refused as breaking `rule` of `field`, showing the
    /// reference and why; a backend that cannot answer now fails the request as unavailable.
    pub(super) async fn resolve_image(
        &self,
        reference: &str,
        field: &str,
        rule: &str,
    ) -> Result<String> {
        match self.deps.sandbox.resolve_image(reference).await {
            Ok(digest) => Ok(digest),
            Err(e) if e.is_retryable() => Err(Error::SandboxUnavailable(format!(
                "cannot resolve image {reference:?} now: {e}"
            ))),
            Err(e) => {
                Err(Invalid::new(field, format!("{rule}: {e}"), format!("{reference:?}")).into())
            }
        }
    }
}
