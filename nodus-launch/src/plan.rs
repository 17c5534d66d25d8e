//! The launcher's plan for one sandbox, and how it travels on standard input: NUL-terminated
//! fields, each item a tag and its values, the program last after `--`.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use crate::Error;

/// What a sandbox is made of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Cgroup `tasks` (v1) or `cgroup.procs` (v2) files to write `0` into before anything
    /// else: the launcher and all it starts then run inside those cgroups.
    pub cgroup_files: Vec<PathBuf>,
    /// The host user and group to become after joining the cgroups, when the launcher starts
    /// as root (a root server's sandboxes); supplementary groups are cleared, and the
    /// launcher makes itself dumpable again to write its user namespace's maps.
    pub user: Option<(u32, u32)>,
    /// Whether the sandbox keeps the host's network (otherwise it gets a network namespace
    /// with only a loopback interface, down).
    pub network: bool,
    /// The host path of the egress proxy's Unix socket for this sandbox: its network
    /// namespace is a new one (never a pooled one) with loopback up, and stage one, outside
    /// the sandbox's pid namespace, bridges `127.0.0.1:`[`EGRESS_PORT`](crate::EGRESS_PORT)
    /// there to the socket (see the `egress` module). Only without [`Plan::network`].
    pub egress: Option<PathBuf>,
    /// The sandbox's host name.
    pub hostname: String,
    /// Host directories bound read-only at the same path.
    pub ro_binds: Vec<PathBuf>,
    /// Mount points below [`Plan::ro_binds`] that are made read-only too (a recursive bind
    /// keeps them, writable unless remounted).
    pub ro_submounts: Vec<PathBuf>,
    /// Symbolic links made in the root: (target, path).
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// Host directories bound read-only at another path: (host path, path inside), bound
    /// after the sandbox's own `/tmp` is there (so a host path below the host's `/tmp` is no
    /// matter). The path inside must not lie below a [`Plan::ro_binds`] directory.
    pub ro_binds_at: Vec<(PathBuf, PathBuf)>,
    /// The size of the sandbox's `/tmp` in bytes.
    pub tmp_size: u64,
    /// The working directory: its host path.
    pub work_host: PathBuf,
    /// Where it appears inside, the program's current directory.
    pub work_inside: PathBuf,
    /// The program's whole environment.
    pub env: Vec<(OsString, OsString)>,
    /// The program and its arguments; with [`Plan::channel`], what each command is appended
    /// to (`/bin/sh -c`).
    pub program: Vec<OsString>,
    /// Whether PID 1 runs the command channel's loop (see the `serve` module) on its standard
    /// output, a socket, instead of starting [`Plan::program`] once.
    pub channel: bool,
    /// Resource limits PID 1 sets on itself before the loop, which every command inherits
    /// (soft and hard).
    pub rlimits: Vec<(Limit, u64)>,
    /// The host user and group the sandbox's processes are (stage one fills it in for stage
    /// two).
    pub outer: Option<(u32, u32)>,
    /// The CPUs stage one pins itself to first, which every process of the sandbox inherits
    /// (their numbers); empty: the CPUs it was started with.
    pub cpus: Vec<usize>,
}

/// A resource limit of [`Plan::rlimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The largest file a process may write, in bytes (`ulimit -f`).
    FileSize,
    /// Processes of the sandbox's user (`ulimit -u`).
    Processes,
    /// A process's address space, in bytes (`ulimit -v`).
    AddressSpace,
}

impl Limit {
    fn name(self) -> &'static str {
        match self {
            Limit::FileSize => "fsize",
            Limit::Processes => "nproc",
            Limit::AddressSpace => "as",
        }
    }

    fn named(name: &OsString) -> Result<Limit, Error> {
        [Limit::FileSize, Limit::Processes, Limit::AddressSpace]
            .into_iter()
            .find(|limit| name.as_bytes() == limit.name().as_bytes())
            .ok_or_else(|| Error::Plan(format!("unknown limit {name:?}")))
    }
}

impl Plan {
    /// Lays out `dirs` as the host has them: each symbolic link is made again in the sandbox's
    /// root ([`Plan::symlinks`]), each directory is bound read-only ([`Plan::ro_binds`]), and
    /// what is neither (or missing) is left out.
    pub fn add_host_dirs(&mut self, dirs: impl IntoIterator<Item = PathBuf>) {
        for path in dirs {
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(&path) {
                        self.symlinks.push((target, path));
                    }
                }
                Ok(meta) if meta.is_dir() => self.ro_binds.push(path),
                _ => {}
            }
        }
    }

    /// The plan as bytes, for the launcher's standard input. Refuses a field with a NUL byte.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut out = Fields::default();
        for file in &self.cgroup_files {
            out.tag("cgroup").os(file.as_os_str())?;
        }
        if let Some((uid, gid)) = self.user {
            out.tag("user").num(uid).num(gid);
        }
        if let Some((uid, gid)) = self.outer {
            out.tag("outer").num(uid).num(gid);
        }
        if self.network {
            out.tag("net");
        }
        if let Some(socket) = &self.egress {
            out.tag("egress").os(socket.as_os_str())?;
        }
        if self.channel {
            out.tag("channel");
        }
        if !self.cpus.is_empty() {
            let list: Vec<String> = self.cpus.iter().map(usize::to_string).collect();
            out.tag("cpus").tag(&list.join(","));
        }
        for (limit, value) in &self.rlimits {
            out.tag("rlimit").tag(limit.name()).num(value);
        }
        out.tag("hostname").os(self.hostname.as_ref())?;
        for dir in &self.ro_binds {
            out.tag("ro").os(dir.as_os_str())?;
        }
        for dir in &self.ro_submounts {
            out.tag("ro-sub").os(dir.as_os_str())?;
        }
        for (host, inside) in &self.ro_binds_at {
            out.tag("ro-at")
                .os(host.as_os_str())?
                .os(inside.as_os_str())?;
        }
        for (target, path) in &self.symlinks {
            out.tag("symlink")
                .os(target.as_os_str())?
                .os(path.as_os_str())?;
        }
        out.tag("tmp-size").num(self.tmp_size);
        out.tag("work")
            .os(self.work_host.as_os_str())?
            .os(self.work_inside.as_os_str())?;
        for (name, value) in &self.env {
            if name.as_bytes().contains(&b'=') || name.is_empty() {
                return Err(Error::Plan(format!(
                    "environment variable name {name:?} is empty or holds `=`"
                )));
            }
            out.tag("env").os(name)?.os(value)?;
        }
        out.tag("--");
        for arg in &self.program {
            out.os(arg)?;
        }
        Ok(out.0)
    }

    /// Reads a plan written by [`Plan::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Plan, Error> {
        let mut fields = bytes
            .strip_suffix(&[0])
            .unwrap_or(bytes)
            .split(|&b| b == 0)
            .map(|f| OsString::from_vec(f.to_vec()));
        if bytes.is_empty() {
            return Err(Error::Plan("it is empty".to_owned()));
        }
        let mut plan = Plan::default();
        let mut next = |what: &str| {
            fields
                .next()
                .ok_or_else(|| Error::Plan(format!("{what} is missing at the end")))
        };
        loop {
            let tag = next("a tag")?;
            let tag = tag.to_string_lossy().into_owned();
            match tag.as_str() {
                "cgroup" => plan.cgroup_files.push(next("cgroup's file")?.into()),
                "user" => {
                    plan.user = Some((number(next("user's uid")?)?, number(next("user's gid")?)?))
                }
                "outer" => {
                    plan.outer = Some((number(next("outer uid")?)?, number(next("outer gid")?)?))
                }
                "net" => plan.network = true,
                "egress" => plan.egress = Some(next("egress's socket")?.into()),
                "channel" => plan.channel = true,
                "cpus" => {
                    let list = next("cpus' list")?;
                    plan.cpus = list
                        .to_str()
                        .unwrap_or_default()
                        .split(',')
                        .map(|cpu| number(cpu.into()))
                        .collect::<Result<_, _>>()?;
                }
                "rlimit" => {
                    let limit = Limit::named(&next("rlimit's name")?)?;
                    plan.rlimits.push((limit, number(next("rlimit's value")?)?));
                }
                "hostname" => {
                    plan.hostname = next("hostname")?
                        .into_string()
                        .map_err(|name| Error::Plan(format!("hostname {name:?} is not UTF-8")))?
                }
                "ro" => plan.ro_binds.push(next("ro's directory")?.into()),
                "ro-sub" => plan.ro_submounts.push(next("ro-sub's directory")?.into()),
                "ro-at" => {
                    let host = next("ro-at's host path")?.into();
                    plan.ro_binds_at
                        .push((host, next("ro-at's inside path")?.into()));
                }
                "symlink" => {
                    let target = next("symlink's target")?.into();
                    plan.symlinks.push((target, next("symlink's path")?.into()));
                }
                "tmp-size" => plan.tmp_size = number(next("tmp-size")?)?,
                "work" => {
                    plan.work_host = next("work's host path")?.into();
                    plan.work_inside = next("work's inside path")?.into();
                }
                "env" => {
                    let name = next("env's name")?;
                    plan.env.push((name, next("env's value")?));
                }
                "--" => break,
                other => return Err(Error::Plan(format!("unknown item {other:?}"))),
            }
        }
        plan.program = fields.collect();
        if plan.program.first().is_none_or(|p| p.is_empty()) {
            return Err(Error::Plan("no program after `--`".to_owned()));
        }
        if !plan.work_inside.is_absolute() {
            return Err(Error::Plan(format!(
                "the working directory inside, {:?}, is not absolute",
                plan.work_inside
            )));
        }
        Ok(plan)
    }
}

/// A number field.
fn number<T: std::str::FromStr>(field: OsString) -> Result<T, Error> {
    field
        .to_str()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| Error::Plan(format!("{field:?} is not a number")))
}

/// Fields being written.
#[derive(Default)]
struct Fields(Vec<u8>);

impl Fields {
    fn tag(&mut self, tag: &str) -> &mut Self {
        self.0.extend_from_slice(tag.as_bytes());
        self.0.push(0);
        self
    }

    fn num(&mut self, n: impl std::fmt::Display) -> &mut Self {
        self.tag(&n.to_string())
    }

    fn os(&mut self, field: &std::ffi::OsStr) -> Result<&mut Self, Error> {
        if field.as_bytes().contains(&0) {
            return Err(Error::Plan(format!("{field:?} holds a NUL byte")));
        }
        self.0.extend_from_slice(field.as_bytes());
        self.0.push(0);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_reads_back_as_written() {
        let plan = Plan {
            cgroup_files: vec!["/sys/fs/cgroup/pids/nodus/k/tasks".into()],
            user: Some((65534, 65533)),
            network: true,
            egress: Some("/var/lib/nodus/egress/k.sock".into()),
            hostname: "nodus".into(),
            ro_binds: vec!["/usr".into(), "/etc".into()],
            ro_submounts: vec!["/etc/hosts".into()],
            symlinks: vec![("usr/bin".into(), "/bin".into())],
            ro_binds_at: vec![("/var/lib/nodus/trust".into(), "/run/nodus/trust".into())],
            tmp_size: 1 << 28,
            work_host: "/var/lib/nodus/sandboxes/k".into(),
            work_inside: "/work".into(),
            env: vec![("A".into(), "x=y".into()), ("EMPTY".into(), "".into())],
            program: vec!["/bin/sh".into(), "-c".into(), "".into(), "end".into()],
            channel: true,
            rlimits: vec![(Limit::FileSize, 1 << 30), (Limit::AddressSpace, 7)],
            outer: Some((1, 2)),
            cpus: vec![0, 3],
        };
        assert_eq!(
            Plan::decode(&plan.encode().expect("encode")).expect("decode"),
            plan
        );
    }

    #[test]
    fn bad_plans_are_refused_by_name() {
        let no_program = Plan {
            work_inside: "/work".into(),
            ..Plan::default()
        };
        let e = Plan::decode(&no_program.encode().expect("encode")).expect_err("no program");
        assert!(e.to_string().contains("no program"), "{e}");
        let e = Plan::decode(b"bogus\0--\0/bin/sh\0").expect_err("unknown");
        assert!(e.to_string().contains("unknown item \"bogus\""), "{e}");
        let core = [&b"rlimit\0core\0"[..], b"1\0--\0/bin/sh\0"].concat();
        let e = Plan::decode(&core).expect_err("limit");
        assert!(e.to_string().contains("unknown limit \"core\""), "{e}");
        let e = Plan::decode(b"cpus\x001,x\0--\0/bin/sh\0").expect_err("cpus");
        assert!(e.to_string().contains("\"x\" is not a number"), "{e}");
        let e = Plan::decode(b"tmp-size\0lots\0").expect_err("number");
        assert!(e.to_string().contains("\"lots\" is not a number"), "{e}");
        let nul = Plan {
            program: vec!["a\0b".into()],
            ..Plan::default()
        };
        assert!(nul.encode().expect_err("nul").to_string().contains("NUL"));
    }
}
