//! The kind registry's apply order ([`Kind::apply_rank`]) against the engine: every reference
//! the engine checks when an object is created points at a kind of a lower rank, and the
//! references are real — the engine refuses the object, naming the field, while the kind it
//! names is not written yet — so an apply that follows the registry writes every valid
//! document, and one that goes the other way does not.

mod support;

use nodus_core::engine::{Engine, Error};
use nodus_core::resource::Kind;
use serde_json::Value;
use support::{PROJECT, engine, valid_documents};

/// What creating an object of a kind reads of another kind, and the field the engine's
/// refusal names while that kind has no object yet (for the valid documents of `support`).
const READS: [(Kind, Kind, &str); 9] = [
    (
        Kind::Environment,
        Kind::FileSet,
        "spec.splits.test.tasks[1].files.fileSet",
    ),
    (Kind::AgentGroup, Kind::Agent, "spec.agent"),
    (
        Kind::AgentGroup,
        Kind::Environment,
        "spec.evaluation.environment",
    ),
    (Kind::AgentRun, Kind::Agent, "spec.agent"),
    (Kind::AgentRun, Kind::AgentGroup, "spec.group"),
    (Kind::AgentRun, Kind::FileSet, "spec.workdir.baseWorkdir"),
    (Kind::AgentRun, Kind::AgentEnvironment, "spec.environment"),
    (
        Kind::AgentRun,
        Kind::Secret,
        "spec.environment.env[1].valueFrom.secretKeyRef",
    ),
    (
        Kind::AgentGroup,
        Kind::Secret,
        "spec.evaluation (the run of case 0): spec.environment.env[1].valueFrom.secretKeyRef",
    ),
];

#[test]
fn the_apply_order_puts_what_a_kind_reads_first() {
    for (kind, reads, field) in READS {
        assert!(
            reads.apply_rank() < kind.apply_rank(),
            "a {kind} reads a {reads} ({field}), so an apply must write it after the {reads}"
        );
    }
}

/// Creates each document in turn; the refusals, by kind and field.
async fn create_all(engine: &Engine, documents: Vec<(Kind, Value)>) -> Vec<(Kind, String)> {
    let mut refused = Vec::new();
    for (kind, document) in documents {
        match engine.create_document(PROJECT, kind, document).await {
            Ok(_) => {}
            Err(Error::Invalid(invalid)) => refused.push((kind, invalid.field)),
            Err(other) => panic!("a {kind} refused for another reason than its fields: {other}"),
        }
    }
    refused
}

/// The valid documents in the registry's apply order (a stable sort: each kind's documents in
/// their order, as the CLI's apply keeps a file's).
fn in_apply_order(mut documents: Vec<(Kind, Value)>) -> Vec<(Kind, Value)> {
    documents.sort_by_key(|(kind, _)| kind.apply_rank());
    documents
}

#[tokio::test]
async fn the_registrys_order_writes_every_document_and_the_reverse_does_not() {
    let mut backwards = valid_documents();
    backwards.sort_by_key(|(kind, _)| std::cmp::Reverse(kind.apply_rank()));
    let refused = create_all(&engine(), backwards).await;
    assert!(
        !refused.is_empty(),
        "the documents refer to no other kind: the order is not tested"
    );
    let refused = create_all(&engine(), in_apply_order(valid_documents())).await;
    assert_eq!(refused, [], "refused in the registry's order");
}

/// Leaves out the documents of each kind in turn: every document refused then names a
/// kind of a lower rank than its own (whatever the validators check, not only what [`READS`]
/// lists), and every reference of [`READS`] is among the refusals.
#[tokio::test]
async fn each_reference_is_refused_while_its_kind_is_not_written() {
    let mut found = Vec::new();
    for left_out in Kind::WRITABLE {
        let without: Vec<(Kind, Value)> = in_apply_order(valid_documents())
            .into_iter()
            .filter(|(kind, _)| *kind != left_out)
            .collect();
        for (kind, field) in create_all(&engine(), without).await {
            assert!(
                left_out.apply_rank() < kind.apply_rank(),
                "without a {left_out}, a {kind} is refused ({field}): an apply must write \
                 the {left_out} first, but the registry ranks it {:?} and the {kind} {:?}",
                left_out.apply_rank(),
                kind.apply_rank()
            );
            found.push((kind, left_out, field));
        }
    }
    for (kind, reads, field) in READS {
        assert!(
            found.contains(&(kind, reads, field.to_string())),
            "without a {reads}, no {kind} is refused naming {field}: {found:?}"
        );
    }
}
