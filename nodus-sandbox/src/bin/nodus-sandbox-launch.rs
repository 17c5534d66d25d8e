//! The sandbox launcher as an executable of its own (the `nodus` binary is one too, started
//! with `--nodus-launch`): for this crate's tests and benchmarks, and for embedders whose
//! program cannot be a multi-call binary.

fn main() -> std::process::ExitCode {
    nodus_launch::executable_main("nodus-sandbox-launch")
}
