//! Harbor task directories (`task.toml`, `instruction.md`, `tests/test.sh`, `environment/`)
//! as one Environment, read the way harbor 0.25.0's `Task` reads them: the task's id is
//! `[task].name` or else the directory's name; the prompt is `instruction.md` without its
//! leading canary lines; `agent.timeout_sec` becomes the task's run timeout and the largest
//! `verifier.timeout_sec` (default 600) the grader's; `environment.docker_image` is the image.
//!
//! The grader is a `command` grader with `verdictFrom: harborReward`: in a sandbox of its own
//! it copies the task's `tests/` (kept in one FileSet, under the task's id) to `/tests`, runs
//! `bash /tests/test.sh` in the agent's final working directory, and reads the reward the
//! tests write to `/logs/verifier/reward.json` or `reward.txt`. Nodus builds no image: a task
//! that builds its own from `environment/` is imported with `--image` naming the image the
//! operator built from it (or with no image at all).

use serde::{Deserialize, Serialize};

use super::{Imported, Sourced, Target, file_entry, file_set, file_set_name, one_line};
use crate::evaluation::check::GRADER_TIMEOUT_RANGE;
use crate::resource::{DurationSpec, FilesRef, GraderKind, GraderSpec, TaskSpec, VerdictFrom};
use crate::validate::{Invalid, RUN_TIMEOUT_RANGE, Result};

/// The grader's command: the task's tests to `/tests`, `/logs/verifier` made, then
/// `bash /tests/test.sh` in the agent's final working directory, its output kept in
/// `/logs/verifier/test-stdout.txt` (as Harbor keeps it). Its exit status does not matter: the
/// reward file does.
pub const VERIFY_COMMAND: &str = "mkdir -p /grading/tests /grading/logs/verifier \
     /grading/workdir && cp -R \"/grader/$NODUS_TASK_ID/.\" /tests/ && cd /grading/workdir && \
     { bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1; true; }";

/// Harbor's default `verifier.timeout_sec`.
const DEFAULT_VERIFIER_TIMEOUT_SEC: f64 = 600.0;

/// One task directory as read from disk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskDir {
    /// The directory as the user named it (errors name it).
    pub path: String,
    /// Its last component: the task's id when `task.toml` names none.
    pub dir_name: String,
    /// `task.toml`, when there is one.
    pub task_toml: Option<String>,
    /// `instruction.md`, when there is one.
    pub instruction: Option<String>,
    /// The regular files under `tests/`: path relative to `tests/`, bytes, executable.
    pub tests: Vec<(String, Vec<u8>, bool)>,
    /// Whether it has an `environment/` directory.
    pub has_environment_dir: bool,
}

/// Which image the Environment names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageChoice {
    /// Every task's `environment.docker_image`, which must be the same.
    FromTasks,
    /// This one (the operator built it from the tasks' `environment/`).
    Given(String),
    /// None: the server's default image, or the host's system in a process sandbox.
    Without,
}

/// The fields Nodus reads from a task, as Harbor's `Task` reads them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HarborTask {
    /// `Task.name`: `[task].name`, else the directory's name.
    pub id: String,
    /// `Task.instruction`: `instruction.md` without its leading canary lines.
    pub instruction: String,
    /// `agent.timeout_sec`.
    pub agent_timeout_sec: Option<f64>,
    /// `verifier.timeout_sec` (default 600).
    pub verifier_timeout_sec: f64,
    /// `environment.docker_image`.
    pub docker_image: Option<String>,
}

/// `task.toml`: the sections and fields Nodus reads; others are left alone, as Harbor's
/// models ignore fields they do not know.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TaskToml {
    task: Option<PackageInfo>,
    agent: AgentSection,
    verifier: VerifierSection,
    environment: EnvironmentSection,
    steps: Option<Vec<toml::Value>>,
}

#[derive(Debug, Deserialize)]
struct PackageInfo {
    name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AgentSection {
    timeout_sec: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(default)]
struct VerifierSection {
    timeout_sec: f64,
    env: std::collections::BTreeMap<String, String>,
}

impl Default for VerifierSection {
    fn default() -> Self {
        VerifierSection {
            timeout_sec: DEFAULT_VERIFIER_TIMEOUT_SEC,
            env: Default::default(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EnvironmentSection {
    docker_image: Option<String>,
    os: Option<String>,
    env: std::collections::BTreeMap<String, String>,
}

/// Reads one task directory's fields, refusing what Nodus cannot run (naming the file and the
/// field): no `task.toml` or `instruction.md`, malformed TOML, no `tests/test.sh`,
/// multi-step tasks, Windows tasks, environment variables for the agent or the verifier.
pub fn read_task(dir: &TaskDir) -> Result<HarborTask> {
    let at = |file: &str, field: &str| {
        if field.is_empty() {
            format!("{}/{file}", dir.path)
        } else {
            format!("{}/{file}: {field}", dir.path)
        }
    };
    let text = dir.task_toml.as_deref().ok_or_else(|| {
        Invalid::new(
            at("task.toml", ""),
            "must exist: a Harbor task directory has task.toml",
            "nothing",
        )
    })?;
    let deserializer = toml::Deserializer::parse(text).map_err(|e| {
        Invalid::new(
            at("task.toml", ""),
            format!("must be TOML ({})", one_line(e.message())),
            line_of(text, e.span()),
        )
    })?;
    let config: TaskToml = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        Invalid::new(
            at("task.toml", &e.path().to_string()),
            one_line(e.inner().message()),
            line_of(text, e.inner().span()),
        )
    })?;
    if config.steps.as_ref().is_some_and(|steps| !steps.is_empty()) {
        return Err(Invalid::new(
            at("task.toml", "steps"),
            "is not supported: a multi-step task is not one prompt",
            "given",
        ));
    }
    if let Some(os) = config.environment.os.as_deref()
        && !os.eq_ignore_ascii_case("linux")
    {
        return Err(Invalid::new(
            at("task.toml", "environment.os"),
            "must be linux: Nodus runs Linux sandboxes",
            format!("{os:?}"),
        ));
    }
    for (section, env) in [
        ("verifier.env", &config.verifier.env),
        ("environment.env", &config.environment.env),
    ] {
        if let Some(name) = env.keys().next() {
            return Err(Invalid::new(
                at("task.toml", section),
                "is not supported: Nodus gives imported tasks no environment variables \
                 (put them in the Agent's AgentEnvironment)",
                format!("{name:?}"),
            ));
        }
    }
    let id = match &config.task {
        Some(package) => {
            if !is_org_name(&package.name) {
                return Err(Invalid::new(
                    at("task.toml", "task.name"),
                    "must be `org/name`: letters, digits, '.', '_' and '-', each part starting \
                     with a letter or digit, no '..'",
                    format!("{:?}", package.name),
                ));
            }
            package.name.clone()
        }
        None => dir.dir_name.clone(),
    };
    let instruction = dir.instruction.as_deref().ok_or_else(|| {
        Invalid::new(
            at("instruction.md", ""),
            "must exist: it is the task's prompt",
            "nothing",
        )
    })?;
    if !dir.tests.iter().any(|(path, _, _)| path == "test.sh") {
        return Err(Invalid::new(
            at("tests/test.sh", ""),
            "must exist: the grader runs it",
            "nothing",
        ));
    }
    Ok(HarborTask {
        id,
        instruction: strip_canary(&universal_newlines(instruction)),
        agent_timeout_sec: config.agent.timeout_sec,
        verifier_timeout_sec: config.verifier.timeout_sec,
        docker_image: config.environment.docker_image,
    })
}

/// One Environment of the task directories `dirs`, in their order: the tasks in split
/// `target.split`, the tests in one FileSet (`<name>-<version>-tests`, each task's under its
/// id), the grader described in the module's docs.
pub fn import(dirs: &[TaskDir], target: &Target, image: &ImageChoice) -> Result<Imported> {
    if dirs.is_empty() {
        return Err(Invalid::new(
            "DIR",
            "must name at least one task directory",
            "nothing",
        ));
    }
    let mut tasks = Vec::with_capacity(dirs.len());
    let mut tests = Vec::new();
    let mut grader_seconds: u64 = 1;
    let mut images: Vec<(&str, Option<String>)> = Vec::with_capacity(dirs.len());
    let mut seen = std::collections::BTreeMap::new();
    for dir in dirs {
        let task = read_task(dir)?;
        if let Some(other) = seen.insert(task.id.clone(), dir.path.as_str()) {
            return Err(Invalid::new(
                format!("{}: task id", dir.path),
                format!(
                    "must be unique among the imported tasks ({other} has it too; the id is \
                     [task].name, else the directory's name)"
                ),
                format!("{:?}", task.id),
            ));
        }
        let at = |field: &str| format!("{}/task.toml: {field}", dir.path);
        let timeout = match task.agent_timeout_sec {
            Some(seconds) => Some(whole_seconds(
                seconds,
                RUN_TIMEOUT_RANGE,
                at("agent.timeout_sec"),
            )?),
            None => None,
        };
        let verifier = whole_seconds(
            task.verifier_timeout_sec,
            GRADER_TIMEOUT_RANGE,
            at("verifier.timeout_sec"),
        )?;
        grader_seconds = grader_seconds.max(verifier.as_secs());
        for (path, bytes, executable) in &dir.tests {
            tests.push(file_entry(
                format!("{}/{path}", task.id),
                bytes.clone(),
                *executable,
            ));
        }
        images.push((dir.path.as_str(), task.docker_image.clone()));
        tasks.push(Sourced {
            source: dir.path.clone(),
            task: TaskSpec {
                id: task.id,
                prompt: task.instruction,
                hidden: serde_json::Value::Null,
                files: None,
                timeout,
            },
        });
    }
    let image = match image {
        ImageChoice::Given(reference) => reference.clone(),
        ImageChoice::Without => String::new(),
        ImageChoice::FromTasks => same_image(dirs, &images)?,
    };
    let tests_set = file_set(file_set_name(target, "tests")?, tests)?;
    let grader = GraderSpec {
        kind: GraderKind::Command,
        tolerance: None,
        command: Some(VERIFY_COMMAND.to_string()),
        files: Some(FilesRef {
            file_set: tests_set.name().to_string(),
        }),
        timeout: Some(DurationSpec::from_secs(grader_seconds)),
        verdict_from: VerdictFrom::HarborReward,
    };
    let environment = super::environment(target, image, tasks, grader)?;
    Ok(Imported {
        file_sets: vec![tests_set],
        environment,
    })
}

/// The one image every task names; refused, naming the directory, when a task names none (it
/// builds its own from `environment/`) or another one.
fn same_image(dirs: &[TaskDir], images: &[(&str, Option<String>)]) -> Result<String> {
    let mut chosen: Option<(&str, &str)> = None;
    for (dir, (path, image)) in dirs.iter().zip(images) {
        let Some(image) = image.as_deref() else {
            let why = if dir.has_environment_dir {
                "is not set: the task builds its image from environment/, which Nodus does not \
                 do; build and push that image, then import with --image IMAGE (or \
                 --no-image)"
            } else {
                "is not set, and there is no environment/: name an image with --image IMAGE \
                 (or import with --no-image)"
            };
            return Err(Invalid::new(
                format!("{path}/task.toml: environment.docker_image"),
                why,
                "nothing",
            ));
        };
        match chosen {
            None => chosen = Some((path, image)),
            Some((first, other)) if other != image => {
                return Err(Invalid::new(
                    format!("{path}/task.toml: environment.docker_image"),
                    format!(
                        "must be the same for every task of one Environment ({first} names \
                         {other:?}): import them apart, or name one image with --image"
                    ),
                    format!("{image:?}"),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(chosen
        .map(|(_, image)| image.to_string())
        .unwrap_or_default())
}

/// `seconds` rounded up to whole seconds, within `range`.
fn whole_seconds(
    seconds: f64,
    range: std::ops::RangeInclusive<u64>,
    field: String,
) -> Result<DurationSpec> {
    let refuse = || {
        Invalid::new(
            field.clone(),
            format!("must be more than 0 and at most {} seconds", range.end()),
            seconds.to_string(),
        )
    };
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(refuse());
    }
    let whole = seconds.ceil();
    // Checked against the range's end (far below 2^53) before it is made an integer.
    if whole > *range.end() as f64 {
        return Err(refuse());
    }
    let whole = whole as u64;
    Ok(DurationSpec::from_secs(whole.max(*range.start())))
}

/// Harbor's `org/name` rule for `[task].name`.
fn is_org_name(name: &str) -> bool {
    let part = |p: &str| {
        p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    !name.contains("..")
        && matches!(name.split_once('/'), Some((org, rest)) if part(org) && part(rest))
}

/// Text as Python's `read_text` gives it: `\r\n` and `\r` read as `\n`.
fn universal_newlines(text: &str) -> String {
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Harbor's `strip_canary`: leading lines that are canary comments (`<!-- …canary… -->` or
/// `# …canary…`, any case), and the blank lines right after them, removed.
pub fn strip_canary(text: &str) -> String {
    static CANARY: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let canary = CANARY.get_or_init(|| {
        regex::Regex::new(r"(?i)^(<!--.*canary.*-->|#.*canary.*)$").expect("a valid pattern")
    });
    let lines: Vec<&str> = text.split('\n').collect();
    let mut index = 0;
    while index < lines.len() && canary.is_match(lines[index].trim()) {
        index += 1;
    }
    while index < lines.len() && lines[index].trim().is_empty() {
        index += 1;
    }
    lines[index..].join("\n")
}

/// The line of `text` a parse error points at, for the error's value.
fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else {
        return "the file".to_string();
    };
    let start = span.start.min(text.len());
    let number = text[..start].matches('\n').count() + 1;
    let line = text.lines().nth(number - 1).unwrap_or_default();
    format!("line {number}: {:?}", one_line(line))
}

#[cfg(test)]
mod tests;
