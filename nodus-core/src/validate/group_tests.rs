//! AgentGroup rules.

use serde_json::json;

use crate::resource::*;
use crate::validate::test_support::*;

// ---- AgentGroup ----

#[test]
fn group_rules() {
    check::<AgentGroupSpec>(vec![
        (
            with(group(), "/spec/agent", json!("Worker")),
            "spec.agent",
            "\"Worker\"",
        ),
        (
            with(group(), "/spec/limits/maxActive", json!(1001)),
            "spec.limits.maxActive",
            "1001",
        ),
        (
            with(group(), "/spec/limits/maxPending", json!(0)),
            "spec.limits.maxPending",
            "(got 0)",
        ),
        (
            with(group(), "/spec/limits/maxPending", json!(10_001)),
            "spec.limits.maxPending",
            "10001",
        ),
        (
            with(evaluation_group(), "/spec/evaluation/tasks", json!(0)),
            "spec.evaluation.tasks",
            "(got 0)",
        ),
        (
            with(evaluation_group(), "/spec/evaluation/repetitions", json!(0)),
            "spec.evaluation.repetitions",
            "(got 0)",
        ),
        (
            with(
                with(evaluation_group(), "/spec/evaluation/tasks", json!(51)),
                "/spec/evaluation/repetitions",
                json!(2),
            ),
            "spec.evaluation.tasks",
            "= 102",
        ),
        (
            with(
                evaluation_group(),
                "/spec/evaluation/tasks",
                json!(u32::MAX),
            ),
            "spec.evaluation.tasks",
            "4294967295",
        ),
        (
            with(evaluation_group(), "/spec/evaluation/timeout", json!("59s")),
            "spec.evaluation.timeout",
            "between 1m and 24h (got 59s)",
        ),
        (
            with(evaluation_group(), "/spec/evaluation/timeout", json!("25h")),
            "spec.evaluation.timeout",
            "25h",
        ),
        (
            with(
                evaluation_group(),
                "/spec/evaluation/environment",
                json!("nodus/arithmetic-v2"),
            ),
            "spec.evaluation.environment",
            "\"nodus/arithmetic-v2\"",
        ),
        (
            with(
                evaluation_group(),
                "/spec/evaluation/environment",
                json!("nodus/arithmetic-v2@"),
            ),
            "spec.evaluation.environment",
            "@\"",
        ),
        (
            with(
                evaluation_group(),
                "/spec/evaluation/environment",
                json!("Nodus/a@1"),
            ),
            "spec.evaluation.environment",
            "Nodus/a@1",
        ),
        (
            with(
                evaluation_group(),
                "/spec/evaluation/environment",
                json!("a@1 2"),
            ),
            "spec.evaluation.environment",
            "a@1 2",
        ),
        (
            without(evaluation_group(), "/spec/evaluation/tasks"),
            "spec.evaluation.tasks",
            "required",
        ),
        (
            with(evaluation_group(), "/spec/evaluation/split", json!("")),
            "spec.evaluation.split",
            "\"\"",
        ),
    ]);
    for limit in [1, 1000] {
        accept::<AgentGroupSpec>(with(group(), "/spec/limits/maxActive", json!(limit)));
    }
    accept::<AgentGroupSpec>(with(
        with(evaluation_group(), "/spec/evaluation/tasks", json!(50)),
        "/spec/evaluation/repetitions",
        json!(2),
    ));
    for timeout in ["1m", "24h"] {
        accept::<AgentGroupSpec>(with(
            evaluation_group(),
            "/spec/evaluation/timeout",
            json!(timeout),
        ));
    }
}
