//! The `nodus` command: a kubectl-like client for the Nodus API, and `nodus server`.
//!
//! Exit codes are part of the interface (see [`error::exit`] and `nodus --help`).

mod cli;
mod client;
mod commands;
mod config;
mod duration;
mod error;
mod jsonpath;
mod kinds;
mod table;
mod terminal;
mod yaml;

use std::process::ExitCode;

use crate::cli::Command;

/// mimalloc rather than the C library's allocator: a server step makes and frees many small
/// documents, buffers and futures across the runtime's threads, which glibc's per-thread
/// arenas serve with more locking, trimming and `munmap` (BENCHMARKS.md, issue 34).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // The sandbox launcher (`nodus --nodus-launch`, started by the process backend): before
    // anything else, while this process has one thread.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(code) = nodus_launch::run_if_asked(&args) {
        return code;
    }
    // One TLS provider for the process (the client also names it explicitly).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version print to stdout and succeed; the rest is a usage error.
            return ExitCode::from(if e.use_stderr() {
                error::exit::USAGE
            } else {
                error::exit::OK
            });
        }
    };
    let runtime = if matches!(cli.command, Command::Server(_) | Command::Quickstart(_)) {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(error::exit::REFUSED);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::from(error::exit::OK),
        Err(error) => {
            let text = error.render();
            if !text.is_empty() {
                eprintln!("{text}");
            }
            ExitCode::from(error.exit_code())
        }
    }
}
