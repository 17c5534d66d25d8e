//! The built-in Environments of the read-only project `nodus`, and the seeded task
//! generators only built-ins may use.
//!
//! - `nodus/arithmetic-v2@2.0.0`: seeded arithmetic questions per split (`train`, `test`),
//!   graded by the number in the answer (`numeric`); an answer without a number is scored
//!   `invalid`.
//! - `nodus/workdir-files@1.0.0`: tasks that ask for a file in the working directory, graded
//!   by a `command` grader that reads the agent's final working directory.

use std::collections::BTreeMap;

use serde_json::json;

use crate::resource::{
    EnvironmentSpec, FileEntry, FileSetSpec, FilesRef, GeneratorSpec, GraderKind, GraderSpec,
    Object, SplitSpec, TaskSpec,
};

/// The project the built-ins live in (read-only for everyone, readable from every project).
pub const PROJECT: &str = crate::resource::TEMPLATE_PROJECT;

/// The one generator: arithmetic questions.
pub const ARITHMETIC: &str = "arithmetic";

/// The FileSet of the `workdir-files` grader.
pub const WORKDIR_FILES_GRADER: &str = "workdir-files-grader";

/// The built-in Environments, and the FileSets they name (all in [`PROJECT`]).
pub fn environments() -> (Vec<Object<FileSetSpec>>, Vec<Object<EnvironmentSpec>>) {
    let arithmetic = EnvironmentSpec {
        version: "2.0.0".into(),
        image: String::new(),
        splits: ["train", "test"]
            .into_iter()
            .map(|split| {
                (
                    split.to_string(),
                    SplitSpec {
                        tasks: Vec::new(),
                        generator: Some(GeneratorSpec {
                            kind: ARITHMETIC.into(),
                        }),
                    },
                )
            })
            .collect(),
        grader: GraderSpec {
            kind: GraderKind::Numeric,
            tolerance: Some(0.0),
            command: None,
            files: None,
            timeout: None,
            verdict_from: Default::default(),
        },
        network: Default::default(),
    };
    let files = [
        ("hello", "hello.txt", "hello"),
        ("greeting", "greeting.txt", "good morning"),
        ("count", "count.txt", "1 2 3"),
    ];
    let tasks = files
        .iter()
        .map(|(id, file, content)| TaskSpec {
            id: (*id).into(),
            prompt: format!(
                "Create the file {file} in the working directory, containing exactly the text \
                 \"{content}\" (no newline needed). Then answer \"done\"."
            ),
            hidden: json!({"file": file, "expected": content}),
            files: None,
            timeout: None,
        })
        .collect();
    let workdir_files = EnvironmentSpec {
        version: "1.0.0".into(),
        image: String::new(),
        splits: BTreeMap::from([(
            "test".to_string(),
            SplitSpec {
                tasks,
                generator: None,
            },
        )]),
        grader: GraderSpec {
            kind: GraderKind::Command,
            tolerance: None,
            command: Some("sh grader/grade.sh".into()),
            files: Some(FilesRef {
                file_set: WORKDIR_FILES_GRADER.into(),
            }),
            timeout: None,
            verdict_from: Default::default(),
        },
        network: Default::default(),
    };
    let grader_files = FileSetSpec {
        files: vec![FileEntry {
            path: "grade.sh".into(),
            content: GRADE_SH.into(),
            content_base64: None,
            executable: true,
        }],
    };
    (
        vec![Object::new(WORKDIR_FILES_GRADER, grader_files)],
        vec![
            Object::new("arithmetic-v2", arithmetic),
            Object::new("workdir-files", workdir_files),
        ],
    )
}

/// The `workdir-files` grader: is `hidden.file` in the agent's final working directory, with
/// exactly `hidden.expected` in it?
const GRADE_SH: &str = r#"#!/bin/sh
# Reads grading/hidden.json ({"expected":"...","file":"..."}) and grading/workdir/.
field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" grading/hidden.json; }
file=$(field file)
expected=$(field expected)
if [ -z "$file" ]; then echo "hidden.json has no file" >&2; exit 2; fi
if [ -f "grading/workdir/$file" ] && [ "$(cat "grading/workdir/$file")" = "$expected" ]; then
  printf '{"reward": 1, "passed": true, "evidence": "%s holds the expected text"}\n' "$file"
elif [ -f "grading/workdir/$file" ]; then
  printf '{"reward": 0, "passed": false, "evidence": "%s holds other text"}\n' "$file"
else
  printf '{"reward": 0, "passed": false, "evidence": "%s is not in the working directory"}\n' "$file"
fi
"#;

/// `count` tasks of generator `kind` for `split` and `seed`: the same arguments give the same
/// tasks, and each split draws from its own sequence. `None` for an unknown generator.
pub fn generate(kind: &str, split: &str, seed: u64, count: u32) -> Option<Vec<TaskSpec>> {
    if kind != ARITHMETIC {
        return None;
    }
    let mut random = SplitMix64::new(seed ^ fnv1a(split.as_bytes()));
    let mut tasks: Vec<TaskSpec> = Vec::new();
    while tasks.len() < usize::try_from(count).unwrap_or(usize::MAX) {
        let a = 2 + random.below(98);
        let b = 2 + random.below(98);
        let (id, symbol, expected) = match random.below(3) {
            0 => (format!("{a}-plus-{b}"), "+", i64::from(a) + i64::from(b)),
            1 => (format!("{a}-minus-{b}"), "-", i64::from(a) - i64::from(b)),
            _ => (format!("{a}-times-{b}"), "*", i64::from(a) * i64::from(b)),
        };
        if tasks.iter().any(|t| t.id == id) {
            continue;
        }
        tasks.push(TaskSpec {
            id,
            prompt: format!("What is {a} {symbol} {b}? Answer with the number."),
            hidden: json!({"expected": expected}),
            files: None,
            timeout: None,
        });
    }
    Some(tasks)
}

/// A small, well-mixed generator (Steele, Lea and Flood's SplitMix64): deterministic for a seed
/// on every platform, which is all a task draw needs.
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0).
    pub(crate) fn below(&mut self, bound: u32) -> u32 {
        u32::try_from(self.next() % u64::from(bound.max(1))).unwrap_or(0)
    }
}

/// FNV-1a of `bytes`: a stable hash of a split's name.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_tasks_and_splits_differ() {
        let a = generate(ARITHMETIC, "test", 42, 20).unwrap();
        let b = generate(ARITHMETIC, "test", 42, 20).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, generate(ARITHMETIC, "test", 43, 20).unwrap());
        assert_ne!(a, generate(ARITHMETIC, "train", 42, 20).unwrap());
        // A prefix: asking for fewer gives the first ones.
        assert_eq!(generate(ARITHMETIC, "test", 42, 5).unwrap(), a[..5]);
        assert!(generate("poetry", "test", 42, 1).is_none());
    }

    #[test]
    fn each_task_holds_its_own_answer() {
        for task in generate(ARITHMETIC, "test", 7, 50).unwrap() {
            let parts: Vec<&str> = task.id.split('-').collect();
            let (a, b): (i64, i64) = (parts[0].parse().unwrap(), parts[2].parse().unwrap());
            let expected = match parts[1] {
                "plus" => a + b,
                "minus" => a - b,
                _ => a * b,
            };
            assert_eq!(task.hidden, json!({"expected": expected}), "{}", task.id);
        }
    }

    #[test]
    fn splitmix_matches_its_reference_values() {
        // The reference implementation's first outputs for seed 1234567.
        let mut random = SplitMix64::new(1_234_567);
        assert_eq!(random.next(), 6_457_827_717_110_365_317);
        assert_eq!(random.next(), 3_203_168_211_198_807_973);
    }
}
