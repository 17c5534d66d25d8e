//! The command channel of the sandboxes that keep one process alive per run (a Docker
//! container's first process, a bubblewrap sandbox's shell): commands go to that process over
//! its stdin, and their output comes back on its stdout and stderr, between markers.
//!
//! Starting a process for a command in a live sandbox costs a process start; starting the
//! sandbox for it (a `docker exec`'s runc, a bubblewrap's namespaces and mounts) costs many
//! times that. The first process ([`FIRST_PROCESS`]) reads one frame per line:
//! `NONCE LENGTH DIR PAYLOAD`, where the directory and the command are written as `printf %b`
//! text (every byte but visible ASCII, and every backslash, as an octal escape; spaces too in
//! the directory, which is a field), so a frame is one line of plain text (no detach keys, no
//! quotes to balance). A payload or directory without an escape is taken as it is, without
//! the `printf` (a fork of the shell) that decodes the others. A frame whose payload does not
//! have the announced length (a writer that stopped half-way) is skipped, and every frame is
//! preceded by a newline, so such a fragment can never run nor swallow the next command.
//!
//! The launcher's sandboxes have no such shell: their PID 1 reads the same frames and runs the
//! commands the same way itself ([`nodus_launch::Frame`]), one program start fewer.
//!
//! For each frame the first process checks the directory (it must exist and, links resolved,
//! stay inside the working directory), prints `NONCE B` on both streams, runs the command as
//! `/bin/sh -c` with stdin from `/dev/null`, kills whatever the command left running
//! (`kill -9 -1` from the first process spares only itself and the namespace's init), and
//! prints `\nNONCE E STATUS` on stdout and `\nNONCE E` on stderr. The reader ([`Reading`])
//! drops everything before the begin markers (output of an earlier command whose reader went
//! away), keeps what lies between the markers exactly (capped), and takes the status from the
//! stdout trailer. The nonce is fresh for every command and unguessable by it beforehand, so a
//! command's output is not mistaken for a marker by accident.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nodus_core::output::Output;
use nodus_core::sandbox::{Error, ExecOutput, LiveOutput, Stream};

use crate::capped;

/// The first process (`$1` is the working directory). See the [module docs](self).
pub(crate) const FIRST_PROCESS: &str = r#"W=$1; cd -- "$W" || exit 1
while IFS= read -r f; do
  n=${f%% *}; f=${f#* }; l=${f%% *}; f=${f#* }; d=${f%% *}; p=${f#* }
  [ "${#p}" = "$l" ] || continue
  case $p in *\\*) c=$(printf '%bx' "$p"); c=${c%x} ;; *) c=$p ;; esac
  case $d in *\\*) d=$(printf '%bx' "$d"); d=${d%x} ;; esac
  r=
  if cd -P -- "$d" 2>/dev/null; then
    case "$PWD/" in "$W"/*) ;; *) r=outside ;; esac
  else r=missing; fi
  printf '%s B\n' "$n"; printf '%s B\n' "$n" >&2
  if [ -z "$r" ]; then
    (exec /bin/sh -c "$c") </dev/null; r=$?; kill -9 -1 2>/dev/null
  fi
  cd -- "$W"
  printf '\n%s E %s\n' "$n" "$r"; printf '\n%s E\n' "$n" >&2
done"#;

/// The longest trailer after an end marker (` STATUS`) that is accepted.
const MAX_TRAILER: usize = 16;

/// A fresh marker for one command: 128 bits from the standard library's randomly keyed
/// hasher, over a process-wide counter.
pub(crate) fn nonce() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let (a, b) = (
        RandomState::new().hash_one(n),
        RandomState::new().hash_one(!n),
    );
    format!("nodus{a:016x}{b:016x}")
}

/// The line that asks the first process to run `command` in the container directory `dir`.
/// Refuses a command with a NUL byte, which no shell can hold.
pub(crate) fn frame(nonce: &str, dir: &str, command: &str) -> Result<Vec<u8>, Error> {
    if command.contains('\0') {
        return Err(Error::Refused(
            "the command contains a NUL byte, which a shell command cannot hold".to_owned(),
        ));
    }
    let payload = escape(command.as_bytes(), true);
    let dir = escape(dir.as_bytes(), false);
    Ok(format!("\n{nonce} {} {dir} {payload}\n", payload.len()).into_bytes())
}

/// `text` as one shell word: single-quoted, each `'` written `'\''`.
#[cfg_attr(not(feature = "docker"), allow(dead_code))]
pub(crate) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// `bytes` as `printf %b` text: printable ASCII but backslash (and space, unless `spaces`)
/// as is, every other byte as `\0` and three octal digits.
fn escape(bytes: &[u8], spaces: bool) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if (b.is_ascii_graphic() && b != b'\\') || (spaces && b == b' ') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\0{b:03o}"));
        }
    }
    out
}

/// How a command in the channel ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    /// The command ran and exited with this status (128 + n for signal n).
    Exited(i32),
    /// The directory does not exist (or is not a directory).
    MissingDir,
    /// The directory resolves outside the working directory.
    OutsideDir,
}

impl Status {
    /// The exit code this status reports, or the refusal of the working directory, shown as
    /// the request named it (`cwd`).
    pub(crate) fn exit_code(self, cwd: &str) -> Result<i32, Error> {
        match self {
            Status::Exited(code) => Ok(code),
            Status::MissingDir => Err(Error::Refused(format!(
                "working directory {cwd:?} does not exist"
            ))),
            Status::OutsideDir => Err(Error::Refused(format!(
                "working directory {cwd:?} leads outside the working directory"
            ))),
        }
    }
}

/// The output of one command as it arrives, on both streams.
#[derive(Debug)]
pub(crate) struct Reading {
    pub(crate) stdout: Cut,
    pub(crate) stderr: Cut,
}

impl Reading {
    /// Reading the command with this nonce, keeping at most `cap` bytes of each stream.
    #[cfg(test)]
    pub(crate) fn new(nonce: &str, cap: usize) -> Self {
        Reading::live(nonce, cap, None)
    }

    /// [`Reading::new`], reporting what is kept of each stream to `live` as soon as it is
    /// known not to begin an end marker (a lone newline is reported at once: see
    /// [`LiveOutput`]).
    pub(crate) fn live(nonce: &str, cap: usize, live: Option<Arc<dyn LiveOutput>>) -> Self {
        let mut stdout = Cut::new(nonce, cap);
        let mut stderr = Cut::new(nonce, cap);
        if let Some(live) = live {
            stdout.live = Some(Live(live.clone(), Stream::Stdout));
            stderr.live = Some(Live(live, Stream::Stderr));
        }
        Reading { stdout, stderr }
    }

    /// Both streams ended before their end markers (the process that wrote them was killed):
    /// what was held back in case it began a marker is output too.
    pub(crate) fn finish(&mut self) {
        self.stdout.finish();
        self.stderr.finish();
    }

    /// Whether the command's stdout was cut at the cap.
    #[cfg_attr(not(feature = "docker"), allow(dead_code))]
    pub(crate) fn stdout_truncated(&self) -> bool {
        self.stdout.out.truncated
    }

    /// Whether the command began (its begin marker came on stdout).
    pub(crate) fn begun(&self) -> bool {
        !matches!(self.stdout.phase, Phase::Before)
    }

    /// Whether both streams have reached their end markers.
    pub(crate) fn done(&self) -> bool {
        self.stdout.done() && self.stderr.done()
    }

    /// The command's status, once [`Reading::done`].
    pub(crate) fn status(&self) -> Result<Status, Error> {
        let Phase::Done(trailer) = &self.stdout.phase else {
            return Err(Error::Failed("the command has not ended".to_owned()));
        };
        let text = String::from_utf8_lossy(trailer);
        match text.trim() {
            "missing" => Ok(Status::MissingDir),
            "outside" => Ok(Status::OutsideDir),
            code => code.parse().map(Status::Exited).map_err(|_| {
                Error::Failed(format!(
                    "the container's first process reported the status {code:?}"
                ))
            }),
        }
    }

    /// The command's result: `exit_code` when it ended by itself, `stopped` when the disk
    /// watch stopped it, timed out when neither.
    pub(crate) fn into_exec_output(
        self,
        exit_code: Option<i32>,
        stopped: Option<String>,
    ) -> ExecOutput {
        let (stdout, stderr) = self.into_outputs();
        ExecOutput {
            exit_code,
            stdout,
            stderr,
            timed_out: exit_code.is_none() && stopped.is_none(),
            stopped,
        }
    }

    /// What was kept of both streams.
    pub(crate) fn into_outputs(self) -> (Output, Output) {
        (self.stdout.out, self.stderr.out)
    }
}

#[derive(Debug)]
enum Phase {
    /// Before the begin marker: everything is dropped.
    Before,
    /// Between the markers: this is the command's output.
    Inside,
    /// After the end marker, until the end of its line.
    Trailer,
    /// The trailer of the end marker.
    Done(Vec<u8>),
}

/// Where one stream's output is reported as it arrives.
struct Live(Arc<dyn LiveOutput>, Stream);

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Live").field(&self.1).finish()
    }
}

/// One stream of a command, cut out of the channel by its markers.
#[derive(Debug)]
pub(crate) struct Cut {
    begin: Vec<u8>,
    end: Vec<u8>,
    phase: Phase,
    /// Bytes not yet placed: a marker may start in them.
    window: Vec<u8>,
    out: Output,
    cap: usize,
    /// Where the output is reported as it arrives, if anywhere.
    live: Option<Live>,
    /// The position in the command's output of the window's first byte (once inside).
    placed: u64,
    /// The position up to which the output was reported.
    told: u64,
}

impl Cut {
    fn new(nonce: &str, cap: usize) -> Self {
        Cut {
            begin: format!("{nonce} B\n").into_bytes(),
            end: format!("\n{nonce} E").into_bytes(),
            phase: Phase::Before,
            window: Vec::new(),
            out: Output::default(),
            cap,
            live: None,
            placed: 0,
            told: 0,
        }
    }

    /// Reports the output up to position `upto` (within the cap) that was not reported yet;
    /// the window still holds it.
    fn tell(&mut self, upto: u64) {
        let Some(Live(live, stream)) = &self.live else {
            return;
        };
        let upto = upto.min(self.cap as u64);
        if upto > self.told {
            let from = usize::try_from(self.told - self.placed).unwrap_or(usize::MAX);
            let to = usize::try_from(upto - self.placed).unwrap_or(usize::MAX);
            if let Some(bytes) = self.window.get(from..to) {
                live.output(*stream, self.told, bytes);
            }
            self.told = upto;
        }
    }

    /// Takes the first `n` bytes of the window into the output.
    fn place(&mut self, n: usize) {
        capped::push(&mut self.out, self.cap, &self.window[..n]);
        self.window.drain(..n);
        self.placed += n as u64;
    }

    /// How many of the window's last bytes may begin the end marker and are held back from
    /// followers: a lone newline is not (it ends a line far more often than it begins the
    /// marker).
    fn held(&self) -> usize {
        (2..self.end.len())
            .rev()
            .find(|&k| self.window.ends_with(&self.end[..k]))
            .unwrap_or(0)
    }

    fn done(&self) -> bool {
        matches!(self.phase, Phase::Done(_))
    }

    fn finish(&mut self) {
        if matches!(self.phase, Phase::Inside) {
            self.tell(self.placed + self.window.len() as u64);
            self.place(self.window.len());
        }
    }

    /// Takes the next bytes of the stream.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<(), Error> {
        if self.done() {
            return Ok(());
        }
        self.window.extend_from_slice(chunk);
        loop {
            match self.phase {
                Phase::Before => match find(&self.window, &self.begin) {
                    Some(at) => {
                        self.window.drain(..at + self.begin.len());
                        self.phase = Phase::Inside;
                    }
                    None => {
                        keep_tail(&mut self.window, self.begin.len() - 1);
                        return Ok(());
                    }
                },
                Phase::Inside => match find(&self.window, &self.end) {
                    Some(at) => {
                        self.tell(self.placed + at as u64);
                        self.place(at);
                        self.window.drain(..self.end.len());
                        self.phase = Phase::Trailer;
                    }
                    None => {
                        let told = self.window.len() - self.held();
                        self.tell(self.placed + told as u64);
                        let settled = self.window.len().saturating_sub(self.end.len() - 1);
                        self.place(settled);
                        return Ok(());
                    }
                },
                // A trailer longer than the longest accepted is refused whether its line's
                // end came in the same chunk or not.
                Phase::Trailer => match self.window.iter().position(|&b| b == b'\n') {
                    Some(at) if at <= MAX_TRAILER => {
                        let trailer = self.window[..at].to_vec();
                        self.window = Vec::new();
                        self.phase = Phase::Done(trailer);
                        return Ok(());
                    }
                    None if self.window.len() <= MAX_TRAILER => return Ok(()),
                    _ => {
                        return Err(Error::Failed(
                            "the container's first process wrote a malformed end marker".to_owned(),
                        ));
                    }
                },
                Phase::Done(_) => return Ok(()),
            }
        }
    }
}

/// Keeps the last `n` bytes of `bytes`.
fn keep_tail(bytes: &mut Vec<u8>, n: usize) {
    let cut = bytes.len().saturating_sub(n);
    bytes.drain(..cut);
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `stream` to a fresh cut in chunks of `size` bytes.
    fn cut(nonce: &str, cap: usize, stream: &[u8], size: usize) -> Cut {
        let mut cut = Cut::new(nonce, cap);
        for chunk in stream.chunks(size) {
            cut.feed(chunk).expect("well-formed");
        }
        cut
    }

    #[test]
    fn output_between_the_markers_is_kept_exactly_in_any_chunking() {
        let stream = b"old output\nN E 0\nN B\nhello\n\nworld\xff\0no newline\nN E 3\nlater";
        for size in 1..stream.len() {
            let mut reading = Reading::new("N", 1 << 20);
            for chunk in stream.chunks(size) {
                reading.stdout.feed(chunk).expect("well-formed");
            }
            reading.stderr.feed(b"N B\n\nN E\n").expect("well-formed");
            assert!(reading.done(), "chunks of {size}");
            assert_eq!(reading.status().expect("status"), Status::Exited(3));
            let (out, err) = reading.into_outputs();
            assert_eq!(
                out.bytes, b"hello\n\nworld\xff\0no newline",
                "chunks of {size}"
            );
            assert!(!out.truncated && err.bytes.is_empty());
        }
    }

    /// What a follower was told, in order: (stream, offset, bytes).
    #[derive(Default)]
    struct Told(std::sync::Mutex<Vec<(Stream, u64, Vec<u8>)>>);

    impl LiveOutput for Told {
        fn output(&self, stream: Stream, offset: u64, bytes: &[u8]) {
            self.0
                .lock()
                .expect("not poisoned")
                .push((stream, offset, bytes.to_vec()));
        }
    }

    impl Told {
        /// The bytes told of `stream`, checked to follow each other without gap or overlap.
        fn of(&self, stream: Stream) -> Vec<u8> {
            let mut all = Vec::new();
            for (s, offset, bytes) in self.0.lock().expect("not poisoned").iter() {
                if *s == stream {
                    assert_eq!(*offset, all.len() as u64, "contiguous");
                    assert!(!bytes.is_empty());
                    all.extend_from_slice(bytes);
                }
            }
            all
        }
    }

    #[test]
    fn followers_are_told_each_line_as_it_comes_and_the_same_bytes_as_the_record() {
        let told = Arc::new(Told::default());
        let mut reading = Reading::live("N", 1 << 20, Some(told.clone()));
        reading.stdout.feed(b"junk\nN B\nline-1\n").expect("feed");
        // The newline that ends the line is told at once, before anything follows it.
        assert_eq!(told.of(Stream::Stdout), b"line-1\n");
        reading.stdout.feed(b"line-2\n\nN").expect("feed");
        assert_eq!(
            told.of(Stream::Stdout),
            b"line-1\nline-2\n",
            "\\nN is held back"
        );
        reading.stdout.feed(b" E 0\n").expect("feed");
        reading.stderr.feed(b"N B\nwarn\n\nN E\n").expect("feed");
        assert!(reading.done());
        assert_eq!(told.of(Stream::Stderr), b"warn\n");
        let (out, _) = reading.into_outputs();
        assert_eq!(told.of(Stream::Stdout), out.bytes);

        // In any chunking, what is told is the record (here with no final newline, plus at
        // most the marker's newline) and never more than the cap.
        let stream = b"N B\nhello\n\nworld\xff\0no newline\nN E 3\n";
        for cap in [5, 1 << 20] {
            for size in 1..stream.len() {
                let told = Arc::new(Told::default());
                let mut reading = Reading::live("N", cap, Some(told.clone()));
                for chunk in stream.chunks(size) {
                    reading.stdout.feed(chunk).expect("well-formed");
                }
                let (out, _) = reading.into_outputs();
                let seen = told.of(Stream::Stdout);
                assert!(seen.starts_with(&out.bytes), "chunks of {size}");
                assert!(seen.len() <= cap, "chunks of {size}");
                assert!(
                    seen.len() == out.bytes.len() || seen == [out.bytes.as_slice(), b"\n"].concat(),
                    "chunks of {size}: {seen:?}"
                );
            }
        }

        // Cut off before the end marker: everything is told.
        let told = Arc::new(Told::default());
        let mut reading = Reading::live("N", 100, Some(told.clone()));
        reading.stdout.feed(b"N B\nstarted\n\nN").expect("feed");
        reading.finish();
        assert_eq!(told.of(Stream::Stdout), b"started\n\nN");
    }

    #[test]
    fn an_earlier_commands_markers_are_not_this_ones() {
        let stream = b"M B\nother\nM E 0\nN B\nmine\nN E 0\n";
        let c = cut("N", 100, stream, 3);
        assert_eq!(c.out.bytes, b"mine");
        assert!(c.done());
    }

    #[test]
    fn output_beyond_the_cap_is_cut_and_the_end_still_found() {
        let mut stream = b"N B\n".to_vec();
        stream.extend(std::iter::repeat_n(b'x', 10_000));
        stream.extend_from_slice(b"\nN E 0\n");
        let c = cut("N", 100, &stream, 7);
        assert_eq!(c.out.bytes.len(), 100);
        assert!(c.out.truncated && c.done());
    }

    #[test]
    fn statuses_for_directories_and_garbage() {
        for (trailer, status) in [
            (" missing", Some(Status::MissingDir)),
            (" outside", Some(Status::OutsideDir)),
            (" 137", Some(Status::Exited(137))),
            (" nope", None),
        ] {
            let mut reading = Reading::new("N", 10);
            let stdout = format!("N B\n\nN E{trailer}\n");
            reading.stdout.feed(stdout.as_bytes()).expect("feed");
            reading.stderr.feed(b"N B\n\nN E\n").expect("feed");
            assert_eq!(reading.status().ok(), status, "{trailer}");
        }
        let mut long = Cut::new("N", 10);
        assert!(long.feed(b"N B\n\nN E 00000000000000000000000000").is_err());
    }

    #[test]
    fn a_long_trailer_is_refused_in_one_chunk_as_byte_by_byte() {
        // Found by fuzz_any_stream_gives_one_result_in_any_chunking: a trailer longer than
        // MAX_TRAILER was refused when it came byte by byte but taken (as status 0) when its
        // newline came in the same chunk.
        let stream = format!("N B\n\nN E {}0\n", " ".repeat(MAX_TRAILER));
        let mut whole = Cut::new("N", 10);
        assert!(whole.feed(stream.as_bytes()).is_err(), "in one chunk");
        let mut bytes = Cut::new("N", 10);
        let refused = stream.as_bytes().chunks(1).any(|b| bytes.feed(b).is_err());
        assert!(refused, "byte by byte");
        let longest = format!("N B\n\nN E {}7\n", " ".repeat(MAX_TRAILER - 2));
        let mut reading = Reading::new("N", 10);
        reading
            .stdout
            .feed(longest.as_bytes())
            .expect("the longest trailer");
        reading.stderr.feed(b"N B\n\nN E\n").expect("feed");
        assert_eq!(reading.status().expect("status"), Status::Exited(7));
    }

    #[test]
    fn frames_are_one_printable_line_with_the_payload_length() {
        let line = frame("N", "/work/a b", "echo 'hi'\n\\ \t\u{e9}").expect("frame");
        let text = String::from_utf8(line).expect("ascii");
        assert!(text.starts_with('\n') && text.ends_with('\n'));
        let line = text.trim_matches('\n');
        assert!(!line.contains('\n') && line.bytes().all(|b| (0x20..0x7f).contains(&b)));
        let fields: Vec<&str> = line.splitn(4, ' ').collect();
        assert_eq!(fields[0], "N");
        assert_eq!(fields[2], "/work/a\\0040b");
        assert_eq!(fields[3], "echo 'hi'\\0012\\0134 \\0011\\0303\\0251");
        assert_eq!(fields[1], fields[3].len().to_string());
        assert!(frame("N", "/work", "a\0b").is_err());
    }

    #[test]
    fn a_stream_cut_off_before_its_end_marker_keeps_everything_it_said() {
        let mut reading = Reading::new("N", 100);
        reading.stdout.feed(b"N B\nstarted\n").expect("feed");
        reading.stderr.feed(b"N B\nwarn").expect("feed");
        reading.finish();
        assert!(!reading.done());
        let (out, err) = reading.into_outputs();
        assert_eq!(
            (out.bytes.as_slice(), err.bytes.as_slice()),
            (&b"started\n"[..], &b"warn"[..])
        );
        let mut before = Reading::new("N", 100);
        before.stdout.feed(b"older output").expect("feed");
        before.finish();
        assert!(
            before.into_outputs().0.bytes.is_empty(),
            "nothing before the begin marker"
        );
    }

    #[test]
    fn quoted_words_hold_any_text() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's $HOME"), "'it'\\''s $HOME'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn nonces_differ() {
        let a = nonce();
        assert_ne!(a, nonce());
        assert_eq!(a.len(), 5 + 32);
    }
}

/// Property-based fuzzing of the channel's framing: frames decode, as the first process reads
/// them, to exactly the directory and command sent; any stream, cut into chunks anyhow, gives
/// the same result, never panics and holds a bounded number of bytes.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;
    use proptest::sample::Index;

    use super::*;

    /// The bytes `printf %b` makes of `text` (only the escapes [`escape`] writes: `\0` and
    /// three octal digits), or `None` for another backslash.
    fn unescape(text: &str) -> Option<Vec<u8>> {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'\\' {
                let digits = bytes.get(i + 1..i + 5)?;
                if digits[0] != b'0' || !digits[1..].iter().all(|d| (b'0'..=b'7').contains(d)) {
                    return None;
                }
                let value = digits[1..]
                    .iter()
                    .fold(0u32, |n, d| n * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).ok()?);
                i += 5;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        Some(out)
    }

    /// The fields of a frame as the first process splits them: `NONCE LENGTH DIR PAYLOAD`.
    fn fields(line: &str) -> (&str, &str, &str, &str) {
        let (n, rest) = line.split_once(' ').expect("a nonce");
        let (l, rest) = rest.split_once(' ').expect("a length");
        let (d, p) = rest.split_once(' ').expect("a directory");
        (n, l, d, p)
    }

    fn cut_in_chunks(nonce: &str, cap: usize, stream: &[u8], sizes: &[usize]) -> (Cut, bool) {
        let mut cut = Cut::new(nonce, cap);
        let bound = cut.begin.len().max(cut.end.len()).max(MAX_TRAILER + 1);
        let mut rest = stream;
        let mut sizes = sizes.iter().cycle();
        while !rest.is_empty() {
            let size = sizes.next().copied().unwrap_or(1).clamp(1, rest.len());
            let (chunk, tail) = rest.split_at(size);
            rest = tail;
            if cut.feed(chunk).is_err() {
                return (cut, false);
            }
            assert!(
                cut.window.len() < bound,
                "{} bytes held back",
                cut.window.len()
            );
            assert!(cut.out.bytes.len() <= cap);
        }
        (cut, true)
    }

    /// What a cut came to: whether the stream was accepted, the output kept, whether it was
    /// cut, and the trailer once done.
    fn result(cut: &Cut, ok: bool) -> (bool, Vec<u8>, bool, Option<Vec<u8>>) {
        let trailer = match &cut.phase {
            Phase::Done(trailer) => Some(trailer.clone()),
            _ => None,
        };
        if !ok {
            return (false, Vec::new(), false, None);
        }
        (true, cut.out.bytes.clone(), cut.out.truncated, trailer)
    }

    /// Streams made of pieces of markers, statuses and arbitrary bytes.
    fn stream(nonce: &'static str) -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            Just(format!("{nonce} B\n").into_bytes()),
            Just(format!("\n{nonce} E").into_bytes()),
            Just(format!("\n{nonce} E 0\n").into_bytes()),
            (0usize..40).prop_map(move |n| format!("\n{nonce} E {}", " ".repeat(n)).into_bytes()),
            Just(b"\n".to_vec()),
            Just(nonce.as_bytes().to_vec()),
            (any::<Index>(), prop::bool::ANY).prop_map(move |(at, begin)| {
                let marker = if begin {
                    format!("{nonce} B\n")
                } else {
                    format!("\n{nonce} E")
                };
                let cut = at.index(marker.len());
                marker.as_bytes()[..cut].to_vec()
            }),
        ];
        prop::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        /// Any directory and command (without NUL) make one line of visible ASCII whose
        /// fields, split and decoded as the first process does, are the nonce, the
        /// payload's length, the directory and the command.
        #[test]
        fn fuzz_frames_decode_to_the_directory_and_command(
            dir in "\\PC{0,30}|[ -~]{0,30}",
            command in prop_oneof!["\\PC{0,200}", "[ -~\\n\\t]{0,200}", ".{0,50}"],
        ) {
            let nonce = nonce();
            prop_assert!(nonce.bytes().all(|b| b.is_ascii_alphanumeric()));
            match frame(&nonce, &dir, &command) {
                Err(_) => prop_assert!(command.contains('\0')),
                Ok(line) => {
                    let text = String::from_utf8(line).expect("ascii");
                    let line = text
                        .strip_prefix('\n')
                        .and_then(|t| t.strip_suffix('\n'))
                        .expect("a frame is one line between newlines");
                    prop_assert!(line.bytes().all(|b| (0x20..0x7f).contains(&b)), "{}", line);
                    let (n, l, d, p) = fields(line);
                    prop_assert_eq!(n, nonce.as_str());
                    prop_assert_eq!(l, p.len().to_string());
                    prop_assert_eq!(unescape(d).expect("escapes"), dir.as_bytes());
                    prop_assert_eq!(unescape(p).expect("escapes"), command.as_bytes());
                }
            }
        }

        /// The launcher's PID 1, which reads the channel in place of the shell, takes every
        /// frame back to exactly its nonce, directory and command.
        #[test]
        fn fuzz_the_launchers_loop_reads_frames_exactly(
            dir in "\\PC{0,30}|[ -~]{0,30}",
            command in prop_oneof!["\\PC{0,200}", "[ -~\\n\\t\\\\]{0,200}", "[^\\x00]{0,50}"],
        ) {
            let nonce = nonce();
            let line = frame(&nonce, &dir, &command).expect("no NUL");
            let line = line.strip_prefix(b"\n").and_then(|l| l.strip_suffix(b"\n")).expect("one line");
            let read = nodus_launch::Frame::parse(line).expect("a whole frame");
            prop_assert_eq!(read.nonce, nonce.as_bytes());
            prop_assert_eq!(read.dir, dir.as_bytes());
            prop_assert_eq!(read.command, command.as_bytes());
            // A frame cut short (its writer stopped half-way) is skipped.
            prop_assert!(nodus_launch::Frame::parse(&line[..line.len() - 1]).is_none());
        }

        /// A real shell's `printf %b`, as the first process calls it, turns the payload back
        /// into the command, byte for byte.
        #[test]
        fn fuzz_the_shell_decodes_payloads_exactly(
            command in prop_oneof!["\\PC{0,80}", "[ -~\\n\\t\\\\]{0,80}", "[^\\x00]{0,40}"],
        ) {
            let line = frame("N", "/", &command).expect("no NUL");
            let text = String::from_utf8(line).expect("ascii");
            let (_, _, _, payload) = fields(text.trim_matches('\n'));
            // The first process's own line that decodes the payload into `$c`.
            let decode = FIRST_PROCESS
                .lines()
                .find(|l| l.contains("case $p in"))
                .expect("the decoding line");
            let decoded = std::process::Command::new("/bin/sh")
                .args(["-c", &format!("p=$1\n{decode}\nprintf '%s' \"$c\""), "sh", payload])
                .output()
                .expect("sh");
            prop_assert!(decoded.status.success());
            prop_assert_eq!(decoded.stdout, command.as_bytes());
        }

        /// A command's output, after arbitrary earlier output and between its own markers,
        /// is kept exactly (up to the cap) whatever the chunks, with its status.
        #[test]
        fn fuzz_output_between_markers_is_kept_in_any_chunking(
            before in prop::collection::vec(any::<u8>(), 0..200),
            output in prop::collection::vec(any::<u8>(), 0..400),
            code in any::<i32>(),
            cap in 0usize..500,
            sizes in prop::collection::vec(1usize..64, 1..8),
        ) {
            let nonce = nonce();
            let mut stream = before;
            stream.extend_from_slice(format!("{nonce} B\n").as_bytes());
            stream.extend_from_slice(&output);
            stream.extend_from_slice(format!("\n{nonce} E {code}\nlater").as_bytes());
            let (cut, ok) = cut_in_chunks(&nonce, cap, &stream, &sizes);
            prop_assert!(ok);
            prop_assert!(cut.done());
            prop_assert_eq!(&cut.out.bytes[..], &output[..output.len().min(cap)]);
            prop_assert_eq!(cut.out.truncated, output.len() > cap);
            let reading = Reading { stdout: cut, stderr: Cut::new(&nonce, cap) };
            prop_assert_eq!(reading.status().expect("a status"), Status::Exited(code));
        }

        /// Any stream: no panic, at most a marker's worth of bytes held back, at most the cap
        /// kept, and the same result however it is cut into chunks.
        #[test]
        fn fuzz_any_stream_gives_one_result_in_any_chunking(
            stream in stream("nodusfuzz"),
            cap in 0usize..300,
            sizes in prop::collection::vec(1usize..50, 1..8),
        ) {
            let (whole, whole_ok) = cut_in_chunks("nodusfuzz", cap, &stream, &[usize::MAX]);
            let (bytes, bytes_ok) = cut_in_chunks("nodusfuzz", cap, &stream, &[1]);
            let (chunked, chunked_ok) = cut_in_chunks("nodusfuzz", cap, &stream, &sizes);
            let expected = result(&whole, whole_ok);
            prop_assert_eq!(&result(&bytes, bytes_ok), &expected, "byte by byte");
            prop_assert_eq!(&result(&chunked, chunked_ok), &expected, "in chunks of {:?}", sizes);
            if whole_ok && whole.done() {
                let reading = Reading { stdout: whole, stderr: Cut::new("nodusfuzz", cap) };
                let _ = reading.status();
            }
        }
    }
}
