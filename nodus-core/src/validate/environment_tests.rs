//! AgentEnvironment rules, inline and on its own, network among them.

use serde_json::{Value, json};

use crate::resource::*;
use crate::validate::test_support::*;

// ---- AgentEnvironment ----

fn environment() -> Value {
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentEnvironment",
        "metadata": { "name": "research" },
        "spec": {
            "env": [
                { "name": "LOG_LEVEL", "value": "debug" },
                { "name": "GITHUB_TOKEN",
                  "valueFrom": { "secretKeyRef": { "name": "github", "key": "token" } } }
            ],
            "compute": { "cpu": "2", "memory": "2Gi", "nvidia.com/gpu": 0 }
        }
    })
}

#[test]
fn an_environment_in_designs_shape_is_accepted() {
    let accepted = accept::<AgentEnvironmentSpec>(environment());
    let compute = accepted.spec.compute.expect("compute");
    assert_eq!(compute.cpu.and_then(|c| c.cpu_millis()), Some(2000));
    assert_eq!(compute.memory.and_then(|m| m.bytes()), Some(2 << 30));
    assert_eq!(compute.gpu, Some(0));
    accept::<AgentEnvironmentSpec>(with(environment(), "/spec/compute/cpu", json!(0.5)));
    let inline = accept::<AgentRunSpec>(with(
        run(),
        "/spec/environment",
        environment()["spec"].clone(),
    ));
    assert!(matches!(
        inline.spec.environment,
        Some(NameOrInline::Inline(_))
    ));
    let named = accept::<AgentRunSpec>(with(run(), "/spec/environment", json!("team/x")));
    assert_eq!(
        named.spec.environment,
        Some(NameOrInline::Name("team/x".to_string()))
    );
    accept::<AgentSpec>(with(agent(), "/spec/environment", json!("research")));
}

#[test]
fn network_rules_name_the_field() {
    let net = |value: Value| with(environment(), "/spec/network", value);
    let accepted = accept::<AgentEnvironmentSpec>(net(json!({
        "egress": "allowlist",
        "allow": [{"host": "pypi.org", "ports": [443]}, {"host": "*.example.org"},
                  {"cidr": "10.20.0.0/16"}]
    })));
    assert_eq!(accepted.spec.network.allow.len(), 3);
    let inject = |egress: &str, host: &str, header: &str, secret: &str| {
        json!({"egress": egress, "allow": [{"host": "pypi.org"}, {"host": "*.example.org"}],
               "inject": [{"host": host, "header": header,
                           "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]})
    };
    for host in [
        "pypi.org",
        "a.example.org",
        "*.example.org",
        "*.b.example.org",
    ] {
        let accepted = accept::<AgentEnvironmentSpec>(net(inject("allowlist", host, "X-Key", "s")));
        assert_eq!(accepted.spec.network.inject[0].host, host);
    }
    let mut twice = inject("allowlist", "pypi.org", "X-Key", "s");
    let again = twice["inject"][0].clone();
    twice["inject"]
        .as_array_mut()
        .expect("a list")
        .push(json!({"host": "PyPI.org", "header": "x-key",
                     "valueFrom": again["valueFrom"].clone()}));
    check::<AgentEnvironmentSpec>(vec![(net(twice), "spec.network.inject[1].header", "once")]);
    assert!(
        accept::<AgentEnvironmentSpec>(environment())
            .spec
            .network
            .is_default()
    );
    check::<AgentEnvironmentSpec>(vec![
        (
            net(json!({"egress": "open"})),
            "spec.network.egress",
            "open",
        ),
        (
            net(json!({"egress": "none", "allow": [{"host": "a.b"}]})),
            "spec.network.allow",
            "egress: none",
        ),
        (
            net(json!({"egress": "allowlist", "allow": [{"host": "bad host"}]})),
            "spec.network.allow[0].host",
            "\"bad host\"",
        ),
        (
            net(json!({"egress": "allowlist", "allow": [{"cidr": "10.0.0.0/40"}]})),
            "spec.network.allow[0].cidr",
            "10.0.0.0/40",
        ),
        (
            net(json!({"egress": "allowlist", "allow": [{"host": "a", "cidr": "1.2.3.4"}]})),
            "spec.network.allow[0]",
            "not both",
        ),
        (
            net(json!({"egress": "allowlist", "allow": [{"ports": [443]}]})),
            "spec.network.allow[0]",
            "host or cidr",
        ),
        (
            net(json!({"egress": "allowlist", "allow": [{"host": "a", "ports": [0]}]})),
            "spec.network.allow[0].ports",
            "[0]",
        ),
        (
            net(inject(
                "allowlist",
                "api.github.com",
                "Authorization",
                "github",
            )),
            "spec.network.inject[0].host",
            "must be a host spec.network.allow lets through",
        ),
        (
            net(
                json!({"egress": "none", "inject": [{"host": "pypi.org", "header": "X-Key",
                "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
            ),
            "spec.network.inject",
            "egress: none",
        ),
        (
            net(inject("allowlist", "pypi.org", "Host", "github")),
            "spec.network.inject[0].header",
            "\"Host\"",
        ),
        (
            net(inject("allowlist", "pypi.org", "X-Key\r\nEvil", "github")),
            "spec.network.inject[0].header",
            "HTTP header name",
        ),
        (
            net(inject("allowlist", "pypi.org", "X-Key", "Not_A_Label")),
            "spec.network.inject[0].valueFrom.secretKeyRef.name",
            "Not_A_Label",
        ),
        (
            net(inject("allowlist", "bad host", "X-Key", "github")),
            "spec.network.inject[0].host",
            "host name",
        ),
    ]);
}

#[test]
fn environment_rules_name_the_field() {
    let var = |value: Value| with(environment(), "/spec/env", json!([value]));
    check::<AgentEnvironmentSpec>(vec![
        (
            with(environment(), "/spec/compute/tpu", json!(1)),
            "spec.compute.tpu",
            "unknown field",
        ),
        (
            with(environment(), "/spec/compute/cpu", json!("lots")),
            "spec.compute.cpu",
            "\"lots\"",
        ),
        (
            with(environment(), "/spec/compute/cpu", json!("128")),
            "spec.compute.cpu",
            "64 CPUs",
        ),
        (
            with(environment(), "/spec/compute/memory", json!("2GB")),
            "spec.compute.memory",
            "\"2GB\"",
        ),
        (
            with(environment(), "/spec/compute/memory", json!("1Mi")),
            "spec.compute.memory",
            "16Mi",
        ),
        (
            var(json!({ "name": "PATH", "value": "/x" })),
            "spec.env[0].name",
            "reserved",
        ),
        (
            var(json!({ "name": "NODUS_RUN", "value": "x" })),
            "spec.env[0].name",
            "reserved",
        ),
        (
            var(json!({ "name": "1ABC", "value": "x" })),
            "spec.env[0].name",
            "\"1ABC\"",
        ),
        (
            var(json!({ "name": "A" })),
            "spec.env[0]",
            "value or valueFrom",
        ),
        (
            var(json!({ "name": "A", "value": "x",
                        "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } })),
            "spec.env[0]",
            "not both",
        ),
        (
            var(json!({ "name": "A",
                        "valueFrom": { "secretKeyRef": { "name": "Bad_Name", "key": "k" } } })),
            "spec.env[0].valueFrom.secretKeyRef.name",
            "DNS label",
        ),
        (
            with(
                environment(),
                "/spec/env",
                json!([{ "name": "A", "value": "1" }, { "name": "A", "value": "2" }]),
            ),
            "spec.env[1].name",
            "unique",
        ),
    ]);
    check::<AgentRunSpec>(vec![
        (
            with(
                run(),
                "/spec/environment",
                json!({ "env": [{ "name": "HOME", "value": "/" }] }),
            ),
            "spec.environment.env[0].name",
            "reserved",
        ),
        (
            with(
                run(),
                "/spec/environment",
                json!({ "compute": { "gpus": 1 } }),
            ),
            "spec.environment.compute.gpus",
            "unknown field",
        ),
    ]);
    check::<AgentSpec>(vec![(
        with(
            agent(),
            "/spec/environment",
            json!({ "env": [{ "name": "LANG", "value": "C" }] }),
        ),
        "spec.environment.env[0].name",
        "reserved",
    )]);
}

#[test]
fn an_inline_agent_is_checked_by_the_agents_rules() {
    let inline = accept::<AgentRunSpec>(with(
        run(),
        "/spec/agent",
        json!({ "system": "You are terse.", "perRunMaxCostUSD": "0.10" }),
    ));
    let NameOrInline::Inline(agent) = &inline.spec.agent else {
        panic!("an inline agent")
    };
    assert_eq!(agent.system, "You are terse.");
    check::<AgentRunSpec>(vec![
        (
            with(run(), "/spec/agent", json!({ "system": "" })),
            "spec.agent.system",
            "must not be empty",
        ),
        (
            with(
                run(),
                "/spec/agent",
                json!({ "system": "x", "maxTokens": 0 }),
            ),
            "spec.agent.maxTokens",
            "between",
        ),
        (
            with(run(), "/spec/agent", json!({ "system": "x", "bogus": 1 })),
            "spec.agent.bogus",
            "unknown field",
        ),
        (
            with(run(), "/spec/agent", json!(7)),
            "spec.agent",
            "expected",
        ),
    ]);
}
