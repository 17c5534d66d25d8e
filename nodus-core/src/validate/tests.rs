//! The error itself, the spec's examples, deserialization, metadata, and no input panics.

use serde_json::{Value, json};

use crate::catalog::Family;
use crate::money::Usd;
use crate::resource::*;
use crate::validate::test_support::*;
use crate::validate::*;

// ---- the spec's examples ----

#[test]
fn the_specs_agents_pass_and_get_their_defaults() {
    let hello: Object<AgentSpec> = accept(agent());
    assert_eq!(hello.name(), "hello-agent");
    assert_eq!(hello.spec.per_run_max_cost_usd, Usd::from_cents(50));
    assert_eq!(hello.spec.max_tool_calls, 50);
    assert_eq!(hello.spec.max_tokens, AgentSpec::DEFAULT_MAX_TOKENS);

    let worker: Object<AgentSpec> = accept(json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": { "name": "parallel-agents-worker" },
        "spec": {
            "system": "Follow the task's requested answer format; otherwise answer in one short sentence.\n",
            "model": { "access": "Nodus", "families": ["haiku"] },
            "maxTokens": 1024,
            "perRunMaxCostUSD": "0.10"
        }
    }));
    assert_eq!(worker.spec.model.families, Some(vec![Family::Haiku]));
    assert_eq!(worker.spec.max_tokens, 1024);

    let byok: Object<AgentSpec> = accept(byok_agent());
    assert_eq!(byok.spec.model.access, Access::Byok);

    let minimal: Object<AgentSpec> = accept(json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": { "name": "minimal" },
        "spec": { "system": "Be brief." }
    }));
    assert_eq!(minimal.spec.per_run_max_cost_usd.to_string(), "1.00");
    assert_eq!(minimal.spec.max_tool_calls, 50);
    assert_eq!(minimal.spec.model.access, Access::Nodus);
}

#[test]
fn the_specs_runs_pass() {
    let hello: AgentRun = accept(run());
    assert_eq!(
        hello.spec.agent,
        NameOrInline::Name("hello-agent".to_string())
    );
    accept::<AgentRunSpec>(task("a", json!([])));
    accept::<AgentRunSpec>(task("b", json!([])));
    let c: AgentRun = accept(task("c", json!(["a", "b"])));
    assert_eq!(c.spec.depends_on, ["a", "b"]);
    // A task may leave its name out.
    let unnamed: AgentRun = accept(without(task("d", json!(["c"])), "/metadata/name"));
    assert_eq!(unnamed.metadata.name, None);
    // A shared template and the optional fields.
    accept::<AgentRunSpec>(with(
        with(run(), "/spec/agent", json!("nodus/claude-assistant")),
        "/spec",
        json!({
            "agent": "nodus/claude-assistant",
            "input": "hi",
            "keepAlive": true,
            "deadline": "2030-01-01T00:00:00Z",
            "context": { "ticket": 42 },
            "workdir": {
                "baseWorkdir": "repo",
                "artifactMounts": [
                    { "ref": "files#a.txt", "mountPath": "data/a.txt" },
                    { "ref": "files#b.txt", "mountPath": "./data/b.txt" },
                    { "ref": "files#c.txt", "mountPath": "data-c.txt" }
                ]
            },
            "environment": "team/staging",
            "timeout": "30m",
            "image": "python:3.13",
            "postRunAction": { "kind": "agents.noop" }
        }),
    ));
}

#[test]
fn the_specs_groups_pass_and_get_their_defaults() {
    let parallel: AgentGroup = accept(group());
    assert_eq!(parallel.spec.limits.max_active, 2);
    assert_eq!(parallel.spec.limits.max_pending, 10_000);
    assert_eq!(parallel.spec.max_cost_usd, Some(Usd::from_cents(60)));

    let defaults: AgentGroup = accept(without(group(), "/spec/limits"));
    assert_eq!(defaults.spec.limits.max_active, 10);
    assert_eq!(defaults.spec.limits.max_pending, 10_000);

    let evaluation: AgentGroup = accept(evaluation_group());
    let spec = evaluation.spec.evaluation.expect("evaluation");
    assert_eq!((spec.tasks, spec.repetitions, spec.seed), (2, 1, 42));
    accept::<AgentGroupSpec>(with(
        evaluation_group(),
        "/spec/evaluation/environment",
        json!("arithmetic@v2"),
    ));
}

// ---- the error itself ----

#[test]
fn an_error_reads_field_rule_and_value() {
    let error = parse::<AgentGroupSpec>(with(group(), "/spec/limits/maxActive", json!(0)))
        .expect_err("0 is refused");
    assert_eq!(
        error.to_string(),
        "spec.limits.maxActive: must be between 1 and 1000 (got 0)"
    );
    assert_eq!(
        error,
        Invalid::new("spec.limits.maxActive", "must be between 1 and 1000", "0")
    );
}

#[test]
fn long_values_are_shortened_with_their_length() {
    let error = parse::<AgentRunSpec>(with(run(), "/spec/input", json!(long(262_145))))
        .expect_err("too long");
    let message = error.to_string();
    assert_eq!(error.field, "spec.input");
    assert!(message.contains("(262145 bytes)"), "{message}");
    assert!(message.len() < 250, "{message}");
    // Also a long value of the wrong type, and a long unknown key.
    let error = parse::<AgentSpec>(with(agent(), "/spec/maxTokens", json!(long(100_000))))
        .expect_err("a string");
    assert!(error.to_string().contains("(100000 bytes)"), "{error}");
    assert!(error.to_string().len() < 250, "{error}");
    let error = parse::<AgentSpec>(with(agent(), &format!("/spec/{}", long(5_000)), json!(1)))
        .expect_err("unknown");
    assert_eq!(error.rule, "unknown field");
    assert!(error.to_string().len() < 600, "{error}");
}

#[test]
fn check_message_allows_exactly_256_kib() {
    assert_eq!(check_message("payload", &long(MAX_INPUT_BYTES)), Ok(()));
    let error = check_message("payload", &long(MAX_INPUT_BYTES + 1)).expect_err("too long");
    assert_eq!(error.field, "payload");
    assert!(error.rule.contains("262144"), "{error}");
    let error = check_message("payload", "").expect_err("empty");
    assert_eq!(error.value, "\"\"");
    accept::<AgentRunSpec>(with(run(), "/spec/input", json!(long(MAX_INPUT_BYTES))));
    // Multi-byte characters count in bytes, and are never cut in half.
    let wide = "é".repeat(MAX_INPUT_BYTES / 2 + 1);
    let error = check_message("payload", &wide).expect_err("too long in bytes");
    assert!(error.value.contains("(262146 bytes)"), "{error}");
}

#[test]
fn message_keys() {
    assert_eq!(check_message_key("staging-1"), Ok(()));
    assert_eq!(check_message_key(&long(253)), Ok(()));
    for bad in ["", "a\nb", long(254).as_str()] {
        let error = check_message_key(bad).expect_err(bad);
        assert_eq!(error.field, "messageKey");
    }
}

#[test]
fn typed_objects_are_checked_by_kind() {
    assert_eq!(validate(&accept::<AgentSpec>(agent())), Ok(()));
    assert_eq!(validate(&accept::<AgentRunSpec>(run())), Ok(()));
    assert_eq!(validate(&accept::<AgentGroupSpec>(group())), Ok(()));
    let mut group: AgentGroup = accept(group());
    group.spec.limits.max_active = 0;
    assert_eq!(
        validate(&group).map_err(|e| e.field),
        Err("spec.limits.maxActive".to_owned())
    );
    let mut run: AgentRun = accept(task("a", json!([])));
    run.spec.depends_on = vec!["a".to_owned()];
    assert_eq!(
        validate(&run).map_err(|e| e.field),
        Err("spec.dependsOn[0]".to_owned())
    );
}

#[test]
fn dns_labels() {
    for good in ["a", "a-b", "0", "abc123", long(63).as_str()] {
        assert!(is_dns_label(good), "{good}");
    }
    for bad in ["", "-a", "a-", "A", "a_b", "a.b", "é", long(64).as_str()] {
        assert!(!is_dns_label(bad), "{bad}");
    }
}

// ---- deserialization ----

#[test]
fn unknown_fields_are_refused_with_their_path() {
    check::<AgentSpec>(vec![
        (
            with(agent(), "/spec/bogus", json!(1)),
            "spec.bogus",
            "bogus",
        ),
        (
            with(agent(), "/spec/model/bogus", json!(1)),
            "spec.model.bogus",
            "bogus",
        ),
        (
            with(agent(), "/metadata/bogus", json!(1)),
            "metadata.bogus",
            "bogus",
        ),
        (with(agent(), "/bogus", json!(1)), "bogus", "bogus"),
    ]);
    check::<AgentGroupSpec>(vec![
        (
            with(group(), "/spec/limits/bogus", json!(1)),
            "spec.limits.bogus",
            "bogus",
        ),
        (
            with(evaluation_group(), "/spec/evaluation/bogus", json!(1)),
            "spec.evaluation.bogus",
            "expected one of",
        ),
    ]);
    check::<AgentRunSpec>(vec![
        (
            with(
                run(),
                "/spec/workdir",
                json!({ "artifactMounts": [{ "ref": "f#a", "mountPath": "a", "bogus": 1 }] }),
            ),
            "spec.workdir.artifactMounts[0].bogus",
            "bogus",
        ),
        (
            with(
                run(),
                "/spec/postRunAction",
                json!({ "kind": "agents.noop", "x": 1 }),
            ),
            "spec.postRunAction.x",
            "\"x\"",
        ),
    ]);
    let error = parse::<AgentGroupSpec>(with(group(), "/spec/limits/bogus", json!(1)))
        .expect_err("unknown");
    assert_eq!(error.rule, "unknown field");
}

#[test]
fn wrong_types_and_malformed_values_name_their_path() {
    check::<AgentSpec>(vec![
        (
            with(agent(), "/spec/maxTokens", json!("many")),
            "spec.maxTokens",
            "\"many\"",
        ),
        (
            with(agent(), "/spec/maxTokens", json!(-1)),
            "spec.maxTokens",
            "-1",
        ),
        (
            with(agent(), "/spec/maxTokens", json!(5_000_000_000u64)),
            "spec.maxTokens",
            "5000000000",
        ),
        (
            with(agent(), "/spec/perRunMaxCostUSD", json!("abc")),
            "spec.perRunMaxCostUSD",
            "\"abc\"",
        ),
        (
            with(agent(), "/spec/perRunMaxCostUSD", json!("-1")),
            "spec.perRunMaxCostUSD",
            "without a sign",
        ),
        (
            with(agent(), "/spec/perRunMaxCostUSD", json!(0.5)),
            "spec.perRunMaxCostUSD",
            "expected a string (got 0.5)",
        ),
        (
            with(agent(), "/spec/model/access", json!("Other")),
            "spec.model.access",
            "\"Other\"",
        ),
        (
            with(agent(), "/spec/model/families", json!(["haiku", "gpt"])),
            "spec.model.families[1]",
            "\"gpt\"",
        ),
        (
            with(agent(), "/spec/state", json!("Paused")),
            "spec.state",
            "\"Paused\"",
        ),
        (without(agent(), "/spec/system"), "spec.system", "required"),
        (without(agent(), "/spec"), "spec", "required"),
        (json!("an agent"), "document", "\"an agent\""),
        (
            with(agent(), "/metadata/labels", json!({ "team": 1 })),
            "metadata.labels.team",
            "1",
        ),
    ]);
    check::<AgentRunSpec>(vec![
        (
            with(run(), "/spec/timeout", json!("5x")),
            "spec.timeout",
            "\"5x\"",
        ),
        (
            with(run(), "/spec/timeout", json!(true)),
            "spec.timeout",
            "true",
        ),
        (
            with(run(), "/spec/deadline", json!("soon")),
            "spec.deadline",
            "year",
        ),
        (
            with(run(), "/spec/deadline", json!("2030-01-01")),
            "spec.deadline",
            "\"2030-01-01\"",
        ),
        (
            with(run(), "/spec/dependsOn", json!(["a", 2])),
            "spec.dependsOn[1]",
            "2",
        ),
        (
            with(run(), "/spec/context", json!([1])),
            "spec.context",
            "[1]",
        ),
        (without(run(), "/spec/agent"), "spec.agent", "required"),
    ]);
    check::<AgentGroupSpec>(vec![(
        with(group(), "/spec/maxCostUSD", json!("0.1234567890")),
        "spec.maxCostUSD",
        "\"0.1234567890\"",
    )]);
}

#[test]
fn api_version_and_kind() {
    check::<AgentSpec>(vec![
        (
            with(agent(), "/apiVersion", json!("nodus.dev/v2")),
            "apiVersion",
            "\"nodus.dev/v2\"",
        ),
        (run(), "kind", "must be Agent (got \"AgentRun\")"),
        (with(agent(), "/kind", json!("Pod")), "kind", "\"Pod\""),
        (without(agent(), "/kind"), "kind", "required"),
    ]);
    check::<AgentRunSpec>(vec![(group(), "kind", "must be AgentRun")]);
    // Typed objects are re-checked the same way.
    let mut object: Agent = accept(agent());
    object.kind = Kind::AgentGroup;
    assert_eq!(
        validate(&object).map_err(|e| e.field),
        Err("kind".to_owned())
    );
    object.kind = Kind::Agent;
    object.api_version = "v1".to_owned();
    assert_eq!(
        validate(&object).map_err(|e| e.field),
        Err("apiVersion".to_owned())
    );
}

// ---- metadata ----

#[test]
fn metadata_rules() {
    check::<AgentSpec>(vec![
        (
            without(agent(), "/metadata/name"),
            "metadata.name",
            "required",
        ),
        (
            with(agent(), "/metadata/name", json!("Hello")),
            "metadata.name",
            "\"Hello\"",
        ),
        (
            with(agent(), "/metadata/name", json!("")),
            "metadata.name",
            "\"\"",
        ),
        (
            with(agent(), "/metadata/name", json!("-a")),
            "metadata.name",
            "\"-a\"",
        ),
        (
            with(agent(), "/metadata/name", json!("a-")),
            "metadata.name",
            "\"a-\"",
        ),
        (
            with(agent(), "/metadata/name", json!("a_b")),
            "metadata.name",
            "\"a_b\"",
        ),
        (
            with(agent(), "/metadata/name", json!(long(64))),
            "metadata.name",
            &long(64),
        ),
        (
            with(agent(), "/metadata/project", json!("My.Project")),
            "metadata.project",
            "My.Project",
        ),
        (
            with(agent(), "/metadata/labels", json!({ "": "x" })),
            "metadata.labels",
            "\"\"",
        ),
        (
            with(agent(), "/metadata/labels", json!({ long(254): "x" })),
            "metadata.labels",
            "(254 bytes)",
        ),
        (
            with(agent(), "/metadata/labels", json!({ "team": long(64) })),
            "metadata.labels.team",
            &long(64),
        ),
        (
            with(
                agent(),
                "/metadata/labels",
                json!({ "app.nodus.dev/tier": long(64) }),
            ),
            "metadata.labels[\"app.nodus.dev/tier\"]",
            "at most 63",
        ),
    ]);
    check::<AgentGroupSpec>(vec![(
        without(group(), "/metadata/name"),
        "metadata.name",
        "required",
    )]);
    let labelled: Agent = accept(with(
        with(
            agent(),
            "/metadata/labels",
            json!({ long(253): long(63), "a": "" }),
        ),
        "/metadata/project",
        json!("team-a"),
    ));
    assert_eq!(labelled.metadata.project.as_deref(), Some("team-a"));
}

// ---- no input panics ----

fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        "[a-zA-Z0-9./@$# -]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            proptest::collection::btree_map("[a-zA-Z$]{1,10}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #[test]
    fn any_field_value_is_accepted_or_named(
        field in proptest::sample::select(vec![
            "/spec/system", "/spec/model", "/spec/model/families", "/spec/maxTokens",
            "/spec/contextSchema", "/spec/agent", "/spec/dependsOn", "/spec/workdir",
            "/spec/limits", "/spec/evaluation", "/spec/timeout", "/metadata/labels",
            "/metadata/name", "/kind", "/spec", "/metadata",
        ]),
        value in any_json(),
    ) {
        for document in [agent(), task("c", json!(["a"])), evaluation_group()] {
            let document = with(document, field, value.clone());
            let errors = [
                parse::<AgentSpec>(document.clone()).err(),
                parse::<AgentRunSpec>(document.clone()).err(),
                parse::<AgentGroupSpec>(document).err(),
            ];
            for error in errors.into_iter().flatten() {
                proptest::prop_assert!(!error.field.is_empty());
                proptest::prop_assert!(!error.rule.is_empty());
                proptest::prop_assert!(error.to_string().len() < 1000, "{}", error);
            }
        }
    }
}
