//! Starting a process-backend sandbox with Nodus's own launcher ([`nodus_launch`]) instead of
//! bubblewrap: the same namespaces and file system, laid out with fewer steps (see
//! ARCHITECTURE.md). The backend falls back to bubblewrap when the launcher fails its
//! self-check here.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nodus_core::sandbox::Error;
use nodus_launch::Plan;
use tokio::process::Command;

use crate::host::{BwrapConfig, HostUser, SYSTEM_DIRS, WORKDIR, input_file};

/// What every start with the launcher shares, found once.
#[derive(Debug)]
pub(crate) struct Layout {
    /// The launcher's executable.
    pub(crate) program: PathBuf,
    ro_binds: Vec<PathBuf>,
    ro_submounts: Vec<PathBuf>,
    symlinks: Vec<(PathBuf, PathBuf)>,
}

/// Lays out the read-only part of every sandbox's root, as the bubblewrap backend's does.
pub(crate) fn prepare(config: &BwrapConfig, program: PathBuf) -> Result<Layout, Error> {
    if !program.is_file() {
        return Err(Error::Refused(format!(
            "the sandbox launcher {} does not exist",
            program.display()
        )));
    }
    let mut host = Plan::default();
    host.add_host_dirs(
        SYSTEM_DIRS
            .iter()
            .map(PathBuf::from)
            .chain(config.extra_ro_binds.iter().cloned()),
    );
    let Plan {
        ro_binds, symlinks, ..
    } = host;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::Failed(format!("reading /proc/self/mountinfo: {e}")))?;
    let ro_submounts = submounts(&mountinfo, &ro_binds);
    Ok(Layout {
        program,
        ro_binds,
        ro_submounts,
        symlinks,
    })
}

/// The mount points strictly below one of `dirs`, in mount order: a recursive bind takes them
/// along, and each is made read-only too.
fn submounts(mountinfo: &str, dirs: &[PathBuf]) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape(point)))
        .filter(|point| {
            dirs.iter()
                .any(|dir| point.starts_with(dir) && point.as_path() != dir.as_path())
        })
        .collect()
}

/// A mountinfo field with its `\ooo` escapes (space, tab, newline, backslash) decoded.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Layout {
    /// One sandbox's plan.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan(
        &self,
        cgroup_files: Vec<PathBuf>,
        user: Option<HostUser>,
        network: bool,
        tmp_size: u64,
        home: &Path,
        env: Vec<(OsString, OsString)>,
        program: Vec<OsString>,
    ) -> Plan {
        Plan {
            cgroup_files,
            user: user.map(|user| (user.uid, user.gid)),
            network,
            egress: None,
            hostname: "nodus".to_owned(),
            ro_binds: self.ro_binds.clone(),
            ro_submounts: self.ro_submounts.clone(),
            symlinks: self.symlinks.clone(),
            ro_binds_at: Vec::new(),
            tmp_size,
            work_host: home.to_path_buf(),
            work_inside: WORKDIR.into(),
            env,
            program,
            channel: false,
            rlimits: Vec::new(),
            outer: None,
            cpus: Vec::new(),
        }
    }
}

/// The command that starts the launcher with `plan` on its standard input, in `/` with an
/// empty environment, as this process's user: a root server's launcher joins the sandbox's
/// cgroups as root and then becomes the sandbox's user itself ([`Plan::user`]), so that the
/// spawn sets no user and can be a `posix_spawn` (no copy of this process's page tables).
pub(crate) fn command(layout: &Layout, plan: &Plan) -> Result<Command, Error> {
    let data = plan
        .encode()
        .map_err(|e| Error::Refused(format!("cannot run this command: {e}")))?;
    let input = input_file(&data, "the launcher's plan")?;
    let mut command = Command::new(&layout.program);
    // Stage two, the sandbox's PID 1, is a fork of this process: its command line, which
    // commands can read in `/proc/1/cmdline`, names no host path.
    command
        .arg0("nodus-launch")
        .arg(nodus_launch::LAUNCH_ARG)
        .stdin(Stdio::from(input))
        .current_dir("/")
        .env_clear();
    Ok(command)
}

/// Runs `true` in a sandbox laid out as every command's, as `user`, without cgroups: a host where the
/// launcher cannot work says so here, and the backend uses bubblewrap.
pub(crate) async fn probe(
    layout: &Layout,
    sandboxes: &Path,
    user: Option<HostUser>,
    memory: u64,
) -> Result<(), Error> {
    let home = probe_dir(sandboxes, user)?;
    let plan = layout.plan(
        Vec::new(),
        user,
        false,
        memory,
        home.path(),
        Vec::new(),
        ["/bin/sh", "-c", "true"].map(OsString::from).to_vec(),
    );
    let mut command = command(layout, &plan)?;
    command.kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .map_err(|_| Error::Failed("the launcher did not start a sandbox in 30 s".to_owned()))?
        .map_err(|e| {
            Error::Refused(format!(
                "cannot run the launcher ({}): {e}",
                layout.program.display()
            ))
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Refused(format!(
            "the launcher ({}) cannot create a sandbox on this host ({}): {}",
            layout.program.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// An empty directory for the probe's working directory, beside the working directories
/// (which the sandboxes' user can reach); its name holds a `+`, which no sandbox key does.
fn probe_dir(sandboxes: &Path, user: Option<HostUser>) -> Result<ProbeDir, Error> {
    let failed = |e: std::io::Error| Error::Failed(format!("making the probe's directory: {e}"));
    let path = sandboxes.join(format!(
        "+launcher-probe-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    std::fs::create_dir(&path).map_err(failed)?;
    let dir = ProbeDir(path);
    if let Some(user) = user {
        std::os::unix::fs::chown(&dir.0, Some(user.uid), Some(user.gid)).map_err(failed)?;
    }
    Ok(dir)
}

/// A directory removed when dropped.
struct ProbeDir(PathBuf);

impl ProbeDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ProbeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submounts_below_the_bound_directories_are_found_with_escapes_decoded() {
        let mountinfo = "27 1 254:0 / / rw - ext4 /dev/vda rw\n\
             40 27 0:40 / /etc/hosts rw - ext4 /dev/vda rw\n\
             41 27 0:41 / /etc/my\\040file rw - ext4 /dev/vda rw\n\
             42 27 0:42 / /usr rw - ext4 /dev/vda rw\n\
             43 27 0:43 / /etcetera/x rw - ext4 /dev/vda rw\n";
        let found = submounts(mountinfo, &["/usr".into(), "/etc".into()]);
        assert_eq!(
            found,
            [PathBuf::from("/etc/hosts"), PathBuf::from("/etc/my file")]
        );
    }
}
