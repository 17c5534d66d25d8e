//! Starting a process-backend sandbox with bubblewrap, behind the cgroup gate: a peer of
//! [the launcher](crate::launcher), both laying out the file system [`crate::host`]
//! describes.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nodus_core::sandbox::Error;
use tokio::process::Command;

use crate::host::{
    BwrapConfig, HostUser, SANDBOX_PATH, SYSTEM_DIRS, WORKDIR, input_file, prepare_root,
    sandbox_env,
};

/// The cgroup gate: `$1` files to write `0` into (moving the shell itself into the sandbox's
/// cgroups), then the program to become. A file it cannot write ends it with status 125
/// and a line that starts with [`GATE_MESSAGE`].
pub(crate) const GATE: &str = "n=$1; shift; while [ \"$n\" -gt 0 ]; do \
    echo 0 2>/dev/null > \"$1\" || { echo \"nodus-sandbox: cannot join the cgroup $1\" >&2; exit 125; }; \
    shift; n=$((n - 1)); done; exec \"$@\"";

/// What to tell an operator whose host has no `bwrap`.
pub(crate) const INSTALL_HINT: &str = "install bubblewrap: `apt-get install bubblewrap` (Debian, Ubuntu), \
     `dnf install bubblewrap` (Fedora) or `apk add bubblewrap` (Alpine); or ask for the \
     unisolated mode by name";

/// How to start bubblewrap and the arguments that lay out the sandbox's file system.
#[derive(Debug)]
pub(crate) struct BwrapStart {
    pub(crate) bwrap: PathBuf,
    /// `setpriv …` when sandboxes run as another user and the spawn cannot drop to it (the
    /// cgroup gate must be root to join v2 cgroups), empty otherwise.
    setpriv: Vec<OsString>,
    base_args: Vec<OsString>,
}

/// Finds `bwrap` (and `setpriv`), makes the directory of the working directories, checks that
/// the sandboxes' user can reach it, and lays out the file system arguments.
pub(crate) fn prepare(config: &BwrapConfig, drop_at_spawn: bool) -> Result<BwrapStart, Error> {
    let bwrap = match &config.bwrap {
        Some(path) if path.is_file() => path.clone(),
        Some(path) => {
            return Err(Error::Refused(format!(
                "bubblewrap is not installed (no {}): {INSTALL_HINT}",
                path.display()
            )));
        }
        None => find_in_path("bwrap").ok_or_else(|| {
            Error::Refused(format!(
                "bubblewrap is not installed (no `bwrap` in PATH): {INSTALL_HINT}"
            ))
        })?,
    };
    prepare_root(config)?;
    let mut setpriv = Vec::new();
    if let Some(user) = config.run_as.filter(|_| !drop_at_spawn) {
        let program = find_in_path("setpriv").ok_or_else(|| {
            Error::Refused(format!(
                "`setpriv` (util-linux) is not installed, and a server running as root needs it \
                 to run sandboxes as the user {}:{}: `apt-get install util-linux` (Debian, \
                 Ubuntu), `dnf install util-linux` (Fedora) or `apk add setpriv` (Alpine)",
                user.uid, user.gid
            ))
        })?;
        setpriv.extend([
            program.into_os_string(),
            "--reuid".into(),
            user.uid.to_string().into(),
            "--regid".into(),
            user.gid.to_string().into(),
            "--clear-groups".into(),
        ]);
    }

    let mut args: Vec<OsString> = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "nodus",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let system = SYSTEM_DIRS.iter().map(PathBuf::from);
    for path in system.chain(config.extra_ro_binds.iter().cloned()) {
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = fs::read_link(&path) {
                    args.extend(["--symlink".into(), target.into(), path.clone().into()]);
                }
            }
            Ok(meta) if meta.is_dir() => {
                args.extend(["--ro-bind".into(), path.clone().into(), path.clone().into()]);
            }
            _ => {}
        }
    }
    args.extend(
        ["--proc", "/proc", "--dev", "/dev"]
            .iter()
            .map(OsString::from),
    );
    Ok(BwrapStart {
        bwrap,
        setpriv,
        base_args: args,
    })
}

/// The command that starts bubblewrap with the options `args` and then `program`: through the
/// cgroup gate when there are `entry_files` to join, as the sandboxes' user when there is one,
/// in `/` with an empty environment, reading its options from standard input (`--args 0`) so
/// that none of them, host paths included, shows in the sandbox's `/proc/1/cmdline`; only
/// `program` (the shell and the command) does.
pub(crate) fn launch(
    prepared: &BwrapStart,
    spawn_as: Option<HostUser>,
    entry_files: &[PathBuf],
    args: &[OsString],
    program: &[OsString],
) -> Result<Command, Error> {
    let mut data = Vec::new();
    for arg in args {
        let bytes = arg.as_encoded_bytes();
        if bytes.contains(&0) {
            return Err(Error::Refused(
                "cannot run this command: it contains a NUL byte".to_owned(),
            ));
        }
        data.extend_from_slice(bytes);
        data.push(0);
    }
    let file = input_file(&data, "bubblewrap's arguments")?;
    let mut launcher = prepared.setpriv.clone();
    launcher.push(prepared.bwrap.clone().into_os_string());
    let (first, rest) = launcher
        .split_first()
        .ok_or_else(|| Error::Failed("no bubblewrap to start".to_owned()))?;
    let mut command = if entry_files.is_empty() {
        let mut command = Command::new(first);
        command.args(rest);
        command
    } else {
        // A gate shell moves itself into the sandbox's cgroups, then becomes bubblewrap (as
        // the sandboxes' user), so every process of the sandbox starts inside them.
        let mut command = Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(GATE)
            .arg("nodus-sandbox")
            .arg(entry_files.len().to_string())
            .args(entry_files)
            .arg(first)
            .args(rest);
        command
    };
    if let Some(user) = spawn_as {
        // Set in the child before it runs anything; supplementary groups are cleared too.
        command.uid(user.uid).gid(user.gid);
    }
    command
        .args(["--args", "0", "--"])
        .args(program)
        .stdin(Stdio::from(file))
        .current_dir("/")
        .env_clear();
    Ok(command)
}

/// Runs `true` in a sandbox laid out as every command's, so that a host where bubblewrap
/// cannot work says so at `create`, not as a command's failure.
pub(crate) async fn probe(
    prepared: &BwrapStart,
    spawn_as: Option<HostUser>,
    memory: u64,
) -> Result<(), Error> {
    let mut args = prepared.base_args.clone();
    args.extend(
        [
            "--size",
            &memory.to_string(),
            "--tmpfs",
            "/tmp",
            "--remount-ro",
            "/",
        ]
        .iter()
        .map(OsString::from),
    );
    let shell = ["/bin/sh", "-c", "true"].map(OsString::from);
    let mut command = launch(prepared, spawn_as, &[], &args, &shell)?;
    command.kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .map_err(|_| Error::Failed("bubblewrap did not start a sandbox in 30 s".to_owned()))?
        .map_err(|e| {
            Error::Refused(format!(
                "cannot run bubblewrap ({}): {e}; {INSTALL_HINT}",
                prepared.bwrap.display()
            ))
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Refused(format!(
            "bubblewrap ({}) cannot create a sandbox on this host (it needs version 0.8 or \
             later and user namespaces): {}",
            prepared.bwrap.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// What one sandbox's start lays out beyond what every sandbox shares.
pub(crate) struct Start<'a> {
    /// Whether the sandbox shares the host's network.
    pub(crate) network: bool,
    /// The size of its `/tmp`: its memory limit.
    pub(crate) tmp_bytes: u64,
    /// Its working directory on the host, bound at [`WORKDIR`].
    pub(crate) home: &'a Path,
    /// Symbolic links of its root: (target, path).
    pub(crate) links: Vec<(PathBuf, PathBuf)>,
    /// Its environment.
    pub(crate) env: &'a std::collections::BTreeMap<String, String>,
}

/// Bubblewrap's options for one sandbox's start.
pub(crate) fn bwrap_args(bwrap: &BwrapStart, start: Start<'_>) -> Vec<OsString> {
    let mut args = bwrap.base_args.clone();
    let mut push = |items: &[&std::ffi::OsStr]| args.extend(items.iter().map(OsString::from));
    if start.network {
        push(&["--share-net".as_ref()]);
    }
    let tmp_size = start.tmp_bytes.to_string();
    push(&[
        "--size".as_ref(),
        tmp_size.as_ref(),
        "--tmpfs".as_ref(),
        "/tmp".as_ref(),
        "--bind".as_ref(),
        start.home.as_os_str(),
        WORKDIR.as_ref(),
    ]);
    for (target, path) in start.links {
        push(&["--symlink".as_ref(), target.as_os_str(), path.as_os_str()]);
    }
    push(&["--remount-ro".as_ref(), "/".as_ref(), "--clearenv".as_ref()]);
    for (name, value) in sandbox_env(start.env) {
        push(&["--setenv".as_ref(), name.as_ref(), value.as_ref()]);
    }
    push(&["--chdir".as_ref(), WORKDIR.as_ref()]);
    args
}

pub(crate) fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| SANDBOX_PATH.into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
