//! The trust bundle of sandboxes whose only way out is the egress proxy: the host's system
//! roots followed by the certificate of the proxy's own authority (which signs what the proxy
//! shows for hosts whose requests get injected headers), and the variables that point the
//! usual clients at it (OpenSSL and curl, Python's requests, Node).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where distributions keep the system's roots as one PEM file (Debian's first).
const SYSTEM_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The bundle's file name in its directory.
pub(crate) const BUNDLE_FILE: &str = "ca-bundle.pem";

/// Where a sandbox sees the bundle's directory (bound read-only there).
pub(crate) const INSIDE_DIR: &str = "/run/nodus/egress-trust";

/// The bundle's path as a sandbox sees it.
pub(crate) fn inside_bundle() -> PathBuf {
    Path::new(INSIDE_DIR).join(BUNDLE_FILE)
}

/// The variables that make clients trust `bundle` (its path as the sandbox sees it).
pub(crate) fn trust_env(bundle: &Path) -> BTreeMap<String, String> {
    let path = bundle.display().to_string();
    [
        "SSL_CERT_FILE",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), path.clone()))
    .collect()
}

/// The bundle's text: the host's system roots (none when the host keeps no bundle file),
/// then `ca_pem`.
pub(crate) fn bundle_text(ca_pem: &str) -> String {
    let mut text = SYSTEM_BUNDLES
        .iter()
        .find_map(|path| fs::read_to_string(path).ok())
        .unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# The Nodus egress proxy's authority\n");
    text.push_str(ca_pem);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// Writes the bundle of `ca_pem` into `dir` (made readable by everyone: it holds only
/// certificates), replacing what differs at once (a new file renamed over the old); its path.
pub(crate) fn write_bundle(dir: &Path, ca_pem: &str) -> io::Result<PathBuf> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    let path = dir.join(BUNDLE_FILE);
    let text = bundle_text(ca_pem);
    if fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(path);
    }
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let staged = dir.join(format!(
        ".{BUNDLE_FILE}.{}.{}",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&staged)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.set_permissions(fs::Permissions::from_mode(0o644))
        })
        .and_then(|()| fs::rename(&staged, &path));
    if written.is_err() {
        let _ = fs::remove_file(&staged);
    }
    written.map(|()| path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_holds_the_authority_and_is_readable_by_all() {
        let dir = tempfile::tempdir().expect("dir");
        let trust = dir.path().join("egress-trust");
        let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";
        let path = write_bundle(&trust, ca).expect("written");
        let text = fs::read_to_string(&path).expect("read");
        assert!(text.ends_with(&format!("{ca}\n")), "{text}");
        let mode = |p: &Path| fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!((mode(&trust), mode(&path)), (0o755, 0o644));
        // Written again unchanged, and replaced when the authority changes.
        assert_eq!(write_bundle(&trust, ca).expect("again"), path);
        write_bundle(&trust, "other").expect("replaced");
        assert!(
            fs::read_to_string(&path)
                .expect("read")
                .ends_with("other\n")
        );
        let env = trust_env(Path::new("/x/ca-bundle.pem"));
        assert_eq!(env.len(), 4);
        assert!(env.values().all(|v| v == "/x/ca-bundle.pem"));
    }
}
