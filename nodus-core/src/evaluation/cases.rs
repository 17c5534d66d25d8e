//! The batch of an evaluation: which tasks, in which order, how many times. A pure function of
//! the Environment, the split, the number of tasks, the repetitions and the seed, so the same
//! seed gives the same batch.

use super::builtin::{self, SplitMix64};
use crate::resource::{EnvironmentSpec, TaskSpec};
use crate::validate::Invalid;

/// One case of the batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Position in the batch, from 0.
    pub index: u32,
    /// From 1.
    pub repetition: u32,
    /// The task.
    pub task: TaskSpec,
}

/// The run's task key of case `index` (`c007`): short, so that `<group>-<key>` stays a DNS
/// label for any group name of up to 58 characters.
pub fn task_key(index: u32) -> String {
    format!("c{index:03}")
}

/// The batch: `tasks` tasks of `split` drawn with `seed` (a task list is shuffled with the
/// seed and its first `tasks` are taken; a generator makes `tasks` tasks from the seed), each
/// `repetitions` times, task by task. Errors name the field of `spec.evaluation`.
pub fn batch(
    environment: &EnvironmentSpec,
    split: &str,
    tasks: u32,
    repetitions: u32,
    seed: u64,
) -> Result<Vec<Case>, Invalid> {
    let Some(spec) = environment.splits.get(split) else {
        let known: Vec<&str> = environment.splits.keys().map(String::as_str).collect();
        return Err(Invalid::new(
            "spec.evaluation.split",
            format!(
                "must name a split of the Environment (it has {})",
                known.join(", ")
            ),
            format!("{split:?}"),
        ));
    };
    let chosen: Vec<TaskSpec> = match &spec.generator {
        Some(generator) => {
            builtin::generate(&generator.kind, split, seed, tasks).ok_or_else(|| {
                Invalid::new(
                    "spec.evaluation.environment",
                    "names an Environment whose generator this server does not have",
                    format!("{:?}", generator.kind),
                )
            })?
        }
        None => {
            let available = u32::try_from(spec.tasks.len()).unwrap_or(u32::MAX);
            if tasks > available {
                return Err(Invalid::new(
                    "spec.evaluation.tasks",
                    format!("must be at most the {available} tasks of split {split:?}"),
                    tasks.to_string(),
                ));
            }
            shuffled(&spec.tasks, seed)
                .into_iter()
                .take(usize::try_from(tasks).unwrap_or(usize::MAX))
                .collect()
        }
    };
    let mut cases = Vec::new();
    let mut index = 0u32;
    for task in chosen {
        for repetition in 1..=repetitions {
            cases.push(Case {
                index,
                repetition,
                task: task.clone(),
            });
            index += 1;
        }
    }
    Ok(cases)
}

/// `tasks` in the order of a Fisher–Yates shuffle driven by `seed`.
fn shuffled(tasks: &[TaskSpec], seed: u64) -> Vec<TaskSpec> {
    let mut order: Vec<TaskSpec> = tasks.to_vec();
    let mut random = SplitMix64::new(seed);
    for i in (1..order.len()).rev() {
        let bound = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let j = usize::try_from(random.below(bound)).unwrap_or(0);
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{GraderKind, GraderSpec, SplitSpec};
    use std::collections::BTreeMap;

    fn environment(tasks: usize) -> EnvironmentSpec {
        EnvironmentSpec {
            version: "1.0.0".into(),
            image: String::new(),
            splits: BTreeMap::from([(
                "test".to_string(),
                SplitSpec {
                    tasks: (0..tasks)
                        .map(|i| TaskSpec {
                            id: format!("t{i}"),
                            prompt: format!("prompt {i}"),
                            hidden: serde_json::json!({"expected": i}),
                            files: None,
                            timeout: None,
                        })
                        .collect(),
                    generator: None,
                },
            )]),
            grader: GraderSpec {
                kind: GraderKind::Exact,
                tolerance: None,
                command: None,
                files: None,
                timeout: None,
                verdict_from: Default::default(),
            },
            network: Default::default(),
        }
    }

    #[test]
    fn a_batch_repeats_each_task_and_is_the_same_for_the_same_seed() {
        let env = environment(10);
        let cases = batch(&env, "test", 3, 2, 42).unwrap();
        assert_eq!(cases.len(), 6);
        assert_eq!(
            cases
                .iter()
                .map(|c| (c.index, c.repetition))
                .collect::<Vec<_>>(),
            vec![(0, 1), (1, 2), (2, 1), (3, 2), (4, 1), (5, 2)]
        );
        assert_eq!(cases[0].task, cases[1].task);
        assert_ne!(cases[0].task, cases[2].task);
        assert_eq!(cases, batch(&env, "test", 3, 2, 42).unwrap());
        let ids = |seed| -> Vec<String> {
            batch(&env, "test", 10, 1, seed)
                .unwrap()
                .into_iter()
                .map(|c| c.task.id)
                .collect()
        };
        // Another seed draws another order of the same tasks.
        assert_ne!(ids(42), ids(43));
        let mut all = ids(43);
        all.sort();
        let mut expected: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        expected.sort();
        assert_eq!(all, expected);
    }

    #[test]
    fn a_missing_split_or_too_many_tasks_is_refused_naming_the_field() {
        let env = environment(2);
        let missing = batch(&env, "train", 1, 1, 0).unwrap_err();
        assert_eq!(missing.field, "spec.evaluation.split");
        assert!(missing.rule.contains("test"), "{missing}");
        let many = batch(&env, "test", 3, 1, 0).unwrap_err();
        assert_eq!(many.field, "spec.evaluation.tasks");
        assert_eq!(many.value, "3");
        assert_eq!(task_key(7), "c007");
    }
}
