//! The conformance suite against every backend, for real: bubblewrap, the process backend
//! with Nodus's own launcher (resident, and spawned for each sandbox), and Docker pass all of it, the unisolated backend the cases that need no isolation.
//!
//! Docker needs `NODUS_TEST_DOCKER_IMAGE` (set by `scripts/test-env`) and a reachable engine;
//! bubblewrap needs `bwrap`. Neither is skipped when missing: the tests fail and say why.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use nodus_sandbox::conformance::Backend;

/// One directory per test process, under which each backend keeps its sandboxes.
fn root(name: &str) -> PathBuf {
    static ROOT: OnceLock<tempfile::TempDir> = OnceLock::new();
    ROOT.get_or_init(|| {
        // Reachable by the user a root server runs sandboxes as.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        dir
    })
    .path()
    .join(name)
}

mod bwrap {
    use super::*;
    use nodus_sandbox::{BwrapConfig, BwrapSandbox};

    async fn backend() -> Backend {
        static SANDBOX: OnceLock<Arc<BwrapSandbox>> = OnceLock::new();
        let sandbox = SANDBOX
            .get_or_init(|| Arc::new(BwrapSandbox::new(BwrapConfig::new(root("bwrap")))))
            .clone();
        Backend {
            sandbox,
            image: None,
            isolated: true,
        }
    }

    nodus_sandbox::conformance_tests!(all, backend);
    nodus_sandbox::conformance_tests!(disk, backend);
    nodus_sandbox::conformance_tests!(live, backend);
    nodus_sandbox::conformance_tests!(watched, backend);
}

/// A backend started by Nodus's launcher, resident (the default) or spawned for each sandbox
/// (the path a backend takes when its resident launcher cannot be started, and its
/// self-check's); not bubblewrap by the fallback.
async fn launcher_backend(
    cell: &'static OnceLock<Arc<nodus_sandbox::BwrapSandbox>>,
    name: &str,
    resident: bool,
) -> Backend {
    let sandbox = cell
        .get_or_init(|| {
            let mut config = nodus_sandbox::BwrapConfig::new(root(name));
            config.launcher = Some(env!("CARGO_BIN_EXE_nodus-sandbox-launch").into());
            config.resident_launcher = resident;
            Arc::new(nodus_sandbox::BwrapSandbox::new(config))
        })
        .clone();
    assert!(
        sandbox.uses_launcher().await.expect("prepared"),
        "the launcher failed its self-check here (see the log)"
    );
    if !resident {
        assert_eq!(
            sandbox.resident_launcher_pid(),
            None,
            "no resident launcher"
        );
    }
    Backend {
        sandbox,
        image: None,
        isolated: true,
    }
}

mod launcher {
    use super::*;

    async fn backend() -> Backend {
        static SANDBOX: OnceLock<Arc<nodus_sandbox::BwrapSandbox>> = OnceLock::new();
        launcher_backend(&SANDBOX, "launcher", true).await
    }

    nodus_sandbox::conformance_tests!(all, backend);
    nodus_sandbox::conformance_tests!(disk, backend);
    nodus_sandbox::conformance_tests!(live, backend);
    nodus_sandbox::conformance_tests!(watched, backend);
}

mod launcher_spawned {
    use super::*;

    async fn backend() -> Backend {
        static SANDBOX: OnceLock<Arc<nodus_sandbox::BwrapSandbox>> = OnceLock::new();
        launcher_backend(&SANDBOX, "launcher-spawned", false).await
    }

    nodus_sandbox::conformance_tests!(all, backend);
    nodus_sandbox::conformance_tests!(disk, backend);
    nodus_sandbox::conformance_tests!(live, backend);
    nodus_sandbox::conformance_tests!(watched, backend);
}

mod docker {
    use super::*;
    use nodus_sandbox::{DockerConfig, DockerSandbox};

    async fn backend() -> Backend {
        let image = std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
            panic!(
                "NODUS_TEST_DOCKER_IMAGE is not set: run `eval \"$(scripts/test-env start)\"` \
                 first (it starts dockerd and builds the test image)"
            )
        });
        let sandbox = DockerSandbox::connect(DockerConfig::new(image.clone()))
            .await
            .unwrap_or_else(|e| panic!("Docker is not reachable: {e}"));
        Backend {
            sandbox: Arc::new(sandbox),
            image: Some(image),
            isolated: true,
        }
    }

    nodus_sandbox::conformance_tests!(all, backend);
    nodus_sandbox::conformance_tests!(disk, backend);
    nodus_sandbox::conformance_tests!(live, backend);
    // A local engine, as root: its volumes are read and watched on this host.
    nodus_sandbox::conformance_tests!(watched, backend);
}

mod unisolated {
    use super::*;
    use nodus_sandbox::UnisolatedSandbox;

    async fn backend() -> Backend {
        static SANDBOX: OnceLock<Arc<UnisolatedSandbox>> = OnceLock::new();
        let sandbox = SANDBOX
            .get_or_init(|| Arc::new(UnisolatedSandbox::new(root("unisolated"))))
            .clone();
        Backend {
            sandbox,
            image: None,
            isolated: false,
        }
    }

    // Only the cases that need no isolation: this backend has none.
    nodus_sandbox::conformance_tests!(common, backend);
    nodus_sandbox::conformance_tests!(watched, backend);
}
