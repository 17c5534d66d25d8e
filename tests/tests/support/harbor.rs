//! The Python of the venv with harbor 0.25.0 (`NODUS_HARBOR_PYTHON`), for tests that check
//! what Nodus writes or reads against harbor's own models.

/// The Python of a venv with harbor 0.25.0; the test fails without it.
pub fn harbor_python() -> std::path::PathBuf {
    let python = std::env::var_os("NODUS_HARBOR_PYTHON").unwrap_or_else(|| {
        panic!(
            "NODUS_HARBOR_PYTHON is not set: it names the python of a venv with harbor==0.25.0 \
             installed (scripts/test makes /var/tmp/nodus-harbor-venv with Python 3.12); run \
             the tests with ./scripts/test, or set it"
        )
    });
    let python = std::path::PathBuf::from(python);
    assert!(
        python.exists(),
        "NODUS_HARBOR_PYTHON={} does not exist",
        python.display()
    );
    python
}
