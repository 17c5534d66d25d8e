//! The `nodus` command. The kubectl-like client and `nodus server` come with the server
//! issue; until then it says so instead of pretending.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "nodus {}: the command-line client is not built yet; see README.md for the embedding example ({})",
        env!("CARGO_PKG_VERSION"),
        nodus_server::API_PATH
    );
    ExitCode::from(2)
}
