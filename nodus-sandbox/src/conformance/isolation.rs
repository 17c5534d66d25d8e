//! The isolation cases ([`ISOLATION`](super::ISOLATION), and [`DISK`](super::DISK)): no
//! network, no host secrets, no other sandbox's files, no writes outside the working
//! directory, no privileges, and fork bombs, memory hogs, full disks and a gigabyte of output
//! contained.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use super::{Backend, destroy, exec, fresh, request, test_limits, text_of, unique_nanos};

/// No network: only a loopback interface, no routes, and the host's loopback is not the
/// sandbox's.
pub async fn no_network(b: &Backend) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let mark = format!("host-says-{}", unique_nanos());
    let reply = format!(
        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{mark}",
        mark.len()
    );
    let server = std::thread::spawn(move || {
        listener.set_nonblocking(true).expect("nonblocking");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut served = 0;
        while Instant::now() < deadline && served < 2 {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut buf = [0u8; 1024];
                    let _ = stream.read(&mut buf);
                    let _ = stream.write_all(reply.as_bytes());
                    served += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        served
    });
    // The listener works from the host.
    let mut control = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    control.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
    let mut answer = String::new();
    control.read_to_string(&mut answer).expect("read");
    assert!(answer.contains(&mark));

    let id = fresh(b, "net").await;
    let out = exec(
        b,
        &id,
        &format!(
            "busybox wget -q -T 3 -O - http://127.0.0.1:{port}/; echo \"rc=$?\"; \
             cat /proc/net/dev; echo routes; tail -n +2 /proc/net/route"
        ),
    )
    .await;
    let text = text_of(&out);
    assert!(!text.contains(&mark), "reached the host: {text}");
    assert!(!text.contains("rc=0"), "{text}");
    let interfaces: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("Inter-"))
        .skip(2)
        .take_while(|l| !l.starts_with("routes"))
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(interfaces, ["lo"], "{text}");
    let routes = text.split("routes\n").nth(1).unwrap_or("");
    assert_eq!(routes.trim(), "", "no routes: {text}");
    assert_eq!(
        server.join().expect("server"),
        1,
        "only the host's request came"
    );
    destroy(b, &id).await;
}

/// The host's `/etc/shadow` cannot be read.
pub async fn host_secrets_unreadable(b: &Backend) {
    let host = std::fs::read_to_string("/etc/shadow").expect("the test reads /etc/shadow (root)");
    let root_line = host
        .lines()
        .find(|l| l.starts_with("root:"))
        .expect("a root entry")
        .to_owned();
    let id = fresh(b, "shadow").await;
    let out = exec(b, &id, "cat /etc/shadow").await;
    assert!(!text_of(&out).contains(&root_line), "{out:?}");
    assert!(
        out.exit_code != Some(0) || out.stdout.bytes.is_empty(),
        "{out:?}"
    );
    destroy(b, &id).await;
}

/// A sandbox's files cannot be found or read from another sandbox.
pub async fn other_sandbox_unreachable(b: &Backend) {
    let a = fresh(b, "mine").await;
    let other = fresh(b, "theirs").await;
    let name = format!("nodus-secret-{}", unique_nanos());
    let out = exec(b, &a, &format!("echo classified > {name}; pwd")).await;
    let a_dir = text_of(&out).trim().to_owned();
    assert_eq!(out.exit_code, Some(0));

    let out = exec(
        b,
        &other,
        &format!(
            "cat '{a_dir}/{name}'; \
             find / \\( -path /proc -o -path /sys \\) -prune -o -name '{name}' -print 2>/dev/null; \
             true"
        ),
    )
    .await;
    let text = text_of(&out);
    assert!(!text.contains("classified"), "{text}");
    assert!(!text.contains(&name), "found it: {text}");
    destroy(b, &a).await;
    destroy(b, &other).await;
}

/// Nothing outside the working directory can be written; a private `/tmp` is not the host's.
pub async fn no_writes_outside_workdir(b: &Backend) {
    let id = fresh(b, "writes").await;
    let name = format!("nodus-probe-{}", unique_nanos());
    let dirs = ["", "/etc", "/usr", "/bin", "/var", "/root", "/home", "/opt"];
    let mut script = String::new();
    for dir in dirs {
        script.push_str(&format!(
            "touch {dir}/{name} 2>/dev/null && echo wrote {dir}/{name}; \
             mkdir {dir}/{name}.d 2>/dev/null && echo made {dir}/{name}.d; "
        ));
    }
    script.push_str(&format!("touch /tmp/{name}; echo done"));
    let out = exec(b, &id, &script).await;
    assert_eq!(text_of(&out), "done\n", "{out:?}");
    for dir in dirs {
        assert!(!Path::new(&format!("{dir}/{name}")).exists(), "{dir}");
        assert!(!Path::new(&format!("{dir}/{name}.d")).exists(), "{dir}");
    }
    assert!(
        !Path::new(&format!("/tmp/{name}")).exists(),
        "the sandbox's /tmp is its own"
    );
    destroy(b, &id).await;
}

/// A command that writes past the working directory's disk limit ([`test_limits`]: 64 MiB) is
/// stopped at it, and [`ExecOutput::stopped`] says so: one large file ends exactly at the
/// limit, many smaller ones are stopped by the watchdog soon after it. The sandbox works
/// again afterwards, and a command that frees space is not stopped.
pub async fn disk_limit_stops_writers(b: &Backend) {
    let id = fresh(b, "disk").await;
    let limit = test_limits().disk_bytes;
    let mut req = request("dd if=/dev/zero of=big bs=1M count=100 2>/dev/null; wc -c < big");
    req.timeout = Duration::from_secs(30);
    let one = b.sandbox.exec(&id, &req).await.expect("exec");
    assert!(!one.timed_out, "{one:?}");
    let stopped = one.stopped.clone().unwrap_or_default();
    assert!(
        stopped.contains(&format!("disk limit of {limit} bytes")),
        "{one:?}"
    );
    assert_eq!(
        text_of(&one).trim(),
        limit.to_string(),
        "the file ends at the limit"
    );

    // Many files, written slowly: the watchdog stops the command.
    let mut req = request(
        "rm big; for i in $(seq 1 40); do dd if=/dev/zero of=f$i bs=1M count=4 2>/dev/null; \
         sleep 0.05; done; echo finished",
    );
    req.timeout = Duration::from_secs(60);
    let many = b.sandbox.exec(&id, &req).await.expect("exec");
    assert!(!many.timed_out, "{many:?}");
    assert!(!text_of(&many).contains("finished"), "{many:?}");
    let stopped = many.stopped.clone().unwrap_or_default();
    assert!(
        stopped.contains(&format!("disk limit of {limit} bytes")),
        "{many:?}"
    );
    let used = exec(b, &id, "cat f* | wc -c").await;
    let used: u64 = text_of(&used).trim().parse().expect("a count");
    assert!(
        (limit..limit + (32 << 20)).contains(&used),
        "stopped soon after the limit: {used}"
    );

    // Over the limit, a command that frees space runs, and then writing works again.
    let freed = exec(b, &id, "rm f*; echo freed").await;
    assert_eq!((text_of(&freed).as_str(), freed.stopped), ("freed\n", None));
    let again = exec(
        b,
        &id,
        "dd if=/dev/zero of=small bs=1M count=1 2>/dev/null; echo ok",
    )
    .await;
    assert_eq!((text_of(&again).as_str(), again.stopped), ("ok\n", None));

    // A directory made by one command and filled to the limit by the next: stopped at it too
    // (nothing that watches the working directory knew of that directory yet).
    let made = exec(b, &id, "rm small; mkdir -p later/deeper; echo made").await;
    assert_eq!((text_of(&made).as_str(), made.stopped), ("made\n", None));
    let mut req = request(
        "dd if=/dev/zero of=later/deeper/big bs=1M count=100 2>/dev/null; \
         wc -c < later/deeper/big",
    );
    req.timeout = Duration::from_secs(30);
    let deep = b.sandbox.exec(&id, &req).await.expect("exec");
    let stopped = deep.stopped.clone().unwrap_or_default();
    assert!(
        stopped.contains(&format!("disk limit of {limit} bytes")),
        "{deep:?}"
    );
    destroy(b, &id).await;
}

/// A fork bomb hits the process limit; the host and another sandbox carry on while it runs,
/// and the bombed sandbox works again afterwards.
pub async fn fork_bomb_contained(b: &Backend) {
    let bombed = fresh(b, "bomb").await;
    let bystander = fresh(b, "bystander").await;
    // `exec`: the sandbox's shell needs no fork of its own once the bomb has filled the
    // process limit (a `sleep` it had to fork could fail and end the shell early). The bomb
    // starts in a subshell, which is the one to end when its second fork fails (the first
    // child can fill the limit before it), not the command's shell.
    let mut bomb = request("bomb() { bomb | bomb & }; (bomb); exec sleep 30");
    bomb.timeout = Duration::from_secs(6);
    let started = Instant::now();
    let (out, during) = tokio::join!(b.sandbox.exec(&bombed, &bomb), async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let host = std::process::Command::new("true")
            .status()
            .map(|s| s.success());
        let other = b.sandbox.exec(&bystander, &request("echo alive")).await;
        (host, other)
    });
    let out = out.expect("exec");
    assert!(out.timed_out, "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let (host, other) = during;
    assert!(matches!(host, Ok(true)), "the host can start processes");
    assert_eq!(other.expect("bystander").stdout.bytes, b"alive\n");
    let after = exec(b, &bombed, "echo recovered").await;
    assert_eq!(after.stdout.bytes, b"recovered\n");
    destroy(b, &bombed).await;
    destroy(b, &bystander).await;
}

/// A command that wants more memory than the limit fails; the sandbox and another one carry
/// on.
pub async fn memory_hog_contained(b: &Backend) {
    let hog = fresh(b, "hog").await;
    let bystander = fresh(b, "bystander").await;
    // Within the limit works.
    let fine = exec(
        b,
        &hog,
        "dd if=/dev/zero of=/dev/null bs=32M count=1 2>/dev/null",
    )
    .await;
    assert_eq!(fine.exit_code, Some(0), "{fine:?}");
    // dd's block is one allocation, filled from /dev/zero: 600 MiB against a 256 MiB limit.
    let mut req = request("dd if=/dev/zero of=/dev/null bs=600M count=1");
    req.timeout = Duration::from_secs(30);
    let out = b.sandbox.exec(&hog, &req).await.expect("exec");
    assert!(!out.timed_out, "{out:?}");
    assert_ne!(
        out.exit_code,
        Some(0),
        "the hog did not get its memory: {out:?}"
    );
    assert_eq!(exec(b, &hog, "echo ok").await.stdout.bytes, b"ok\n");
    assert_eq!(exec(b, &bystander, "echo ok").await.stdout.bytes, b"ok\n");
    destroy(b, &hog).await;
    destroy(b, &bystander).await;
}

/// Nothing inside gains or uses a privilege: no capabilities and `no_new_privs` (so a setuid
/// binary gains nothing), no mount, no new namespaces, no device nodes and none of the host's
/// block devices, no writes to `/proc/sys` or `/sys`, and no host process visible (so none
/// can be traced or signalled).
pub async fn privileges_refused(b: &Backend) {
    let id = fresh(b, "privileges").await;
    // A host process with a mark in its command line, looked for from inside (the script
    // spells the mark in two halves, so that its own command line does not hold it).
    let tail = unique_nanos();
    let mark = format!("30.{tail}");
    let mut host = std::process::Command::new("sleep")
        .arg(&mark)
        .spawn()
        .expect("a host process");
    let script = format!(
        "grep -E '^(CapEff|CapPrm|CapAmb|NoNewPrivs):' /proc/self/status; \
         mkdir -p m; mount -t tmpfs none m 2>/dev/null && echo ESCAPE mount; \
         unshare -r true 2>/dev/null && echo ESCAPE unshare-user; \
         unshare -m true 2>/dev/null && echo ESCAPE unshare-mount; \
         unshare -n true 2>/dev/null && echo ESCAPE unshare-net; \
         mknod null2 c 1 3 2>/dev/null && echo ESCAPE mknod; \
         find /dev -type b 2>/dev/null | sed 's/^/ESCAPE block device /'; \
         cat /proc/sys/kernel/printk_ratelimit > /proc/sys/kernel/printk_ratelimit 2>/dev/null \
           && echo ESCAPE proc-write; \
         cat /sys/kernel/mm/ksm/run > /sys/kernel/mm/ksm/run 2>/dev/null && echo ESCAPE sys-write; \
         head=30.; tail={tail}; for f in /proc/[0-9]*/cmdline; do \
           case \"$(tr '\\0' ' ' < $f 2>/dev/null)\" in \
             *\"$head$tail\"*) echo ESCAPE host process $f ;; esac; done; \
         echo done"
    );
    let out = exec(b, &id, &script).await;
    let _ = host.kill();
    let _ = host.wait();
    let text = text_of(&out);
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .to_string()
    };
    for set in ["CapEff:", "CapPrm:", "CapAmb:"] {
        assert_eq!(field(set), "0000000000000000", "{set} {text}");
    }
    assert_eq!(field("NoNewPrivs:"), "1", "{text}");
    assert!(!text.contains("ESCAPE"), "{text}");
    assert!(text.ends_with("done\n"), "{out:?}");
    destroy(b, &id).await;
}

/// A command that writes a gigabyte of output at once is cut at the output cap and finishes;
/// another sandbox works meanwhile, and the memory the backend holds stays bounded.
pub async fn gigabyte_of_output_contained(b: &Backend) {
    let loud = fresh(b, "gigabyte").await;
    let bystander = fresh(b, "bystander").await;
    let flood = request("head -c 1073741824 /dev/zero; echo done >&2");
    let before = resident_bytes();
    let started = Instant::now();
    let (out, other) = tokio::join!(b.sandbox.exec(&loud, &flood), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.sandbox.exec(&bystander, &request("echo alive")).await
    });
    let out = out.expect("exec");
    let took = started.elapsed();
    // It finishes, or is stopped at its timeout (a backend that moves output slowly).
    let summary = format!(
        "exit {:?}, timed out {}, {} bytes of stdout kept, stderr {:?}, {took:?}",
        out.exit_code,
        out.timed_out,
        out.stdout.bytes.len(),
        String::from_utf8_lossy(&out.stderr.bytes)
    );
    assert!(
        out.exit_code == Some(0) && out.stderr.bytes == b"done\n" || out.timed_out,
        "{summary}"
    );
    assert!(took < flood.timeout + Duration::from_secs(30), "{summary}");
    assert_eq!(out.stdout.bytes.len() as u64, flood.output_cap, "{summary}");
    assert!(out.stdout.truncated, "{summary}");
    assert_eq!(other.expect("bystander").stdout.bytes, b"alive\n");
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 256 << 20,
        "the backend held {grown} more bytes after a gigabyte of output"
    );
    assert_eq!(exec(b, &loud, "echo ok").await.stdout.bytes, b"ok\n");
    destroy(b, &loud).await;
    destroy(b, &bystander).await;
}

/// This process's resident size (`VmRSS`), in bytes.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
