//! `nodus-launch`: the sandbox launcher alone, installed beside `nodus`. `nodus server` starts
//! its sandboxes with it when it is there (a small program starts faster than `nodus`), else
//! with `nodus --nodus-launch`.

fn main() -> std::process::ExitCode {
    nodus_launch::executable_main("nodus-launch")
}
