//! Table tests of reading Harbor task directories and importing them.

use super::*;

fn dir(name: &str, toml: &str) -> TaskDir {
    TaskDir {
        path: format!("tasks/{name}"),
        dir_name: name.to_string(),
        task_toml: Some(toml.to_string()),
        instruction: Some(format!("Do {name}.\n")),
        tests: vec![(
            "test.sh".into(),
            b"echo 1 > /logs/verifier/reward.txt\n".to_vec(),
            true,
        )],
        has_environment_dir: true,
    }
}

fn target() -> Target {
    Target {
        name: "bench".into(),
        version: "1.2.0".into(),
        split: "test".into(),
    }
}

#[test]
fn a_task_is_read_as_harbor_reads_it() {
    let read = read_task(&dir(
        "hello",
        "version = \"1.0\"\n[task]\nname = \"acme/hello-world\"\n[agent]\ntimeout_sec = 120\n\
         [verifier]\ntimeout_sec = 30.5\n[environment]\ndocker_image = \"ghcr.io/acme/hello:1\"\n\
         cpus = 2\n[metadata]\ndifficulty = \"easy\"\n",
    ))
    .expect("read");
    assert_eq!(
        read,
        HarborTask {
            id: "acme/hello-world".into(),
            instruction: "Do hello.\n".into(),
            agent_timeout_sec: Some(120.0),
            verifier_timeout_sec: 30.5,
            docker_image: Some("ghcr.io/acme/hello:1".into()),
        }
    );
    // Without [task], the directory names it; Harbor's defaults apply.
    let read = read_task(&dir("plain", "")).expect("read");
    assert_eq!(
        (
            read.id.as_str(),
            read.agent_timeout_sec,
            read.verifier_timeout_sec
        ),
        ("plain", None, 600.0)
    );
}

#[test]
fn canary_lines_and_the_blank_lines_after_them_are_stripped() {
    for (text, stripped) in [
        (
            "<!-- BENCHMARK DATA canary GUID 1 -->\n\nDo it.\n",
            "Do it.\n",
        ),
        ("# CANARY string\n# canary again\n  \nDo it.", "Do it."),
        (
            "Do it.\n# canary later stays\n",
            "Do it.\n# canary later stays\n",
        ),
        ("# a comment\nDo it.", "# a comment\nDo it."),
        (
            "<!-- canary --> trailing\nDo it.",
            "<!-- canary --> trailing\nDo it.",
        ),
    ] {
        assert_eq!(strip_canary(text), stripped, "{text:?}");
    }
    let mut windows = dir("crlf", "");
    windows.instruction = Some("# canary\r\n\r\nLine one.\r\nLine two.\r\n".into());
    assert_eq!(
        read_task(&windows).expect("read").instruction,
        "Line one.\nLine two.\n"
    );
}

#[test]
fn what_cannot_be_run_is_refused_naming_the_file_and_the_field() {
    let no_instruction = TaskDir {
        instruction: None,
        ..dir("a", "")
    };
    let no_toml = TaskDir {
        task_toml: None,
        ..dir("a", "")
    };
    let no_test = TaskDir {
        tests: vec![("test.bat".into(), Vec::new(), false)],
        ..dir("a", "")
    };
    for (task, field, rule) in [
        (no_instruction, "tasks/a/instruction.md", "must exist"),
        (no_toml, "tasks/a/task.toml", "must exist"),
        (no_test, "tasks/a/tests/test.sh", "must exist"),
        (
            dir("a", "[agent\ntimeout_sec = 1"),
            "tasks/a/task.toml",
            "must be TOML",
        ),
        (
            dir("a", "[verifier]\ntimeout_sec = \"soon\"\n"),
            "tasks/a/task.toml: verifier.timeout_sec",
            "invalid type",
        ),
        (
            dir("a", "[task]\nname = \"no-org\"\n"),
            "tasks/a/task.toml: task.name",
            "org/name",
        ),
        (
            dir("a", "[[steps]]\nname = \"one\"\n"),
            "tasks/a/task.toml: steps",
            "multi-step",
        ),
        (
            dir("a", "[environment]\nos = \"windows\"\n"),
            "tasks/a/task.toml: environment.os",
            "linux",
        ),
        (
            dir(
                "a",
                "[verifier.env]\nOPENAI_API_KEY = \"${OPENAI_API_KEY}\"\n",
            ),
            "tasks/a/task.toml: verifier.env",
            "not supported",
        ),
    ] {
        let error = read_task(&task).expect_err(field);
        assert_eq!(error.field, field, "{error:?}");
        assert!(error.rule.contains(rule), "{error:?}");
    }
    // A parse error shows the line it points at.
    let error = read_task(&dir("a", "[agent]\ntimeout_sec = = 3\n")).expect_err("bad TOML");
    assert!(error.value.starts_with("line 2"), "{error:?}");
}

#[test]
fn directories_become_one_environment_with_a_harbor_grader() {
    let mut second = dir(
        "two",
        "[verifier]\ntimeout_sec = 900\n[environment]\ndocker_image = \"img:1\"\n",
    );
    second
        .tests
        .push(("data/expected.txt".into(), vec![0xff, 0x00], false));
    let first = dir(
        "one",
        "[agent]\ntimeout_sec = 0.4\n[environment]\ndocker_image = \"img:1\"\n",
    );
    let imported = import(&[first, second], &target(), &ImageChoice::FromTasks).expect("imported");
    let spec = &imported.environment.spec;
    assert_eq!(imported.environment.name(), "bench");
    assert_eq!(spec.version, "1.2.0");
    assert_eq!(spec.image, "img:1");
    let tasks = &spec.splits["test"].tasks;
    assert_eq!(
        tasks
            .iter()
            .map(|t| (
                t.id.as_str(),
                t.prompt.as_str(),
                t.timeout.map(|d| d.as_secs())
            ))
            .collect::<Vec<_>>(),
        vec![("one", "Do one.\n", Some(1)), ("two", "Do two.\n", None)]
    );
    assert_eq!(spec.grader.kind, GraderKind::Command);
    assert_eq!(spec.grader.verdict_from, VerdictFrom::HarborReward);
    assert_eq!(spec.grader.command.as_deref(), Some(VERIFY_COMMAND));
    assert_eq!(spec.grader.timeout.map(|d| d.as_secs()), Some(900));
    let set = &imported.file_sets[0];
    assert_eq!(set.name(), "bench-1-2-0-tests");
    assert_eq!(
        spec.grader.files.as_ref().map(|f| f.file_set.as_str()),
        Some(set.name())
    );
    let paths: Vec<(&str, bool)> = set
        .spec
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.executable))
        .collect();
    assert_eq!(
        paths,
        vec![
            ("one/test.sh", true),
            ("two/test.sh", true),
            ("two/data/expected.txt", false)
        ]
    );
    assert_eq!(set.spec.files[2].bytes().expect("bytes"), vec![0xff, 0x00]);

    // The image: given, left out, or refused when the tasks disagree or build their own.
    let given = import(
        &[dir("a", "")],
        &target(),
        &ImageChoice::Given("built:2".into()),
    )
    .expect("given");
    assert_eq!(given.environment.spec.image, "built:2");
    let without = import(&[dir("a", "")], &target(), &ImageChoice::Without).expect("without");
    assert_eq!(without.environment.spec.image, "");
    for (dirs, field, rule) in [
        (
            vec![dir("a", "")],
            "tasks/a/task.toml: environment.docker_image",
            "environment/",
        ),
        (
            vec![
                dir("a", "[environment]\ndocker_image = \"x:1\"\n"),
                dir("b", "[environment]\ndocker_image = \"y:1\"\n"),
            ],
            "tasks/b/task.toml: environment.docker_image",
            "the same",
        ),
        (
            vec![dir("a", "[agent]\ntimeout_sec = -1\n")],
            "tasks/a/task.toml: agent.timeout_sec",
            "more than 0",
        ),
        (
            vec![dir("a", "[verifier]\ntimeout_sec = 7200\n")],
            "tasks/a/task.toml: verifier.timeout_sec",
            "at most 3600",
        ),
        (
            vec![dir("a", ""), dir("a", "")],
            "tasks/a: task id",
            "unique",
        ),
        (
            vec![TaskDir {
                instruction: Some("  \n".into()),
                ..dir("a", "")
            }],
            "tasks/a: spec.splits.test.tasks[0].prompt",
            "bytes of text",
        ),
        (vec![], "DIR", "at least one"),
    ] {
        let error =
            import(&dirs, &target(), &ImageChoice::Without.clone_if(field)).expect_err(field);
        assert_eq!(error.field, field, "{error:?}");
        assert!(error.rule.contains(rule), "{error:?}");
    }
}

impl ImageChoice {
    /// The image choice a refusal case needs: the tasks' own for the image cases.
    fn clone_if(&self, field: &str) -> ImageChoice {
        if field.ends_with("docker_image") {
            ImageChoice::FromTasks
        } else {
            self.clone()
        }
    }
}
