//! The sandbox launcher as an executable of its own (the `nodus` binary is one too, started
//! with `--nodus-launch`): for this crate's tests and benchmarks, and for embedders whose
//! program cannot be a multi-call binary.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    nodus_launch::run_if_asked(&args).unwrap_or_else(|| {
        eprintln!(
            "nodus-sandbox-launch is started by the sandbox backend (first argument {}), \
             not by hand",
            nodus_launch::LAUNCH_ARG
        );
        ExitCode::from(2)
    })
}
