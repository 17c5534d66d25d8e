//! How an error shows where it is and what it got: field paths as written in the YAML
//! (`spec.dependsOn[1]`), values quoted and cut when long.

use std::fmt::Write as _;

use serde_json::Value;

use super::Invalid;

/// Characters of a value shown before it is cut.
pub(super) const SHOWN_CHARS: usize = 80;
/// Characters of an unrecognised deserializer message kept as the rule.
pub(super) const SHOWN_MESSAGE_CHARS: usize = 160;
/// Path steps shown before the middle of a deep path is elided.
pub(super) const SHOWN_STEPS: usize = 24;
/// What an error shows for a field that is absent.
pub(super) const NOTHING: &str = "nothing";
/// The steps from the root to `node`, following parents.
pub(super) fn steps_to<'a>(nodes: &[(Option<usize>, Step<'a>)], node: usize) -> Vec<Step<'a>> {
    let mut steps = Vec::new();
    let mut current = Some(node);
    while let Some((parent, step)) = current.and_then(|index| nodes.get(index)) {
        steps.push(*step);
        current = *parent;
    }
    steps.reverse();
    steps
}
/// Turns a deserializer's error into an [`Invalid`] naming the field's path.
pub(super) fn deserialize_error(
    document: &Value,
    error: &serde_path_to_error::Error<serde_json::Error>,
) -> Invalid {
    use serde_path_to_error::Segment;

    let mut steps: Vec<Step<'_>> = error
        .path()
        .iter()
        .map(|segment| match segment {
            Segment::Seq { index } => Step::Index(*index),
            Segment::Map { key } => Step::Key(key),
            Segment::Enum { variant } => Step::Key(variant),
            Segment::Unknown => Step::Key("?"),
        })
        .collect();
    let found = || shown_json(lookup(document, error.path()));
    let message = error.inner().to_string();

    if let Some(rest) = message.strip_prefix("unknown field `") {
        // The path already ends with the unknown key; keep serde's list of expected fields.
        let tail = match steps.last() {
            Some(Step::Key(key)) => rest.strip_prefix(*key).and_then(|r| r.strip_prefix('`')),
            _ => None,
        };
        let value = match (steps.last(), tail) {
            (Some(Step::Key(key)), Some(tail)) => format!("{}{tail}", shown(key)),
            _ => shorten(rest, SHOWN_MESSAGE_CHARS),
        };
        return Invalid::new(field_path(&steps), "unknown field", value);
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.strip_suffix('`').unwrap_or(rest);
        steps.push(Step::Key(name));
        return Invalid::new(field_path(&steps), "required", NOTHING);
    }
    let field = field_path(&steps);
    // Money and durations: "<rule>, got <text>".
    if let Some((rule, _)) = message.split_once(", got ") {
        return Invalid::new(field, rule, found());
    }
    // serde's own "invalid type: <found>, expected <what>" and the like; <found> may quote
    // the user's value in full, so only <what> is kept.
    let serdes_own = [
        "invalid type: ",
        "invalid value: ",
        "invalid length ",
        "unknown variant ",
    ]
    .iter()
    .any(|prefix| message.starts_with(prefix));
    if let Some((_, expected)) = message.rsplit_once(", expected ").filter(|_| serdes_own) {
        return Invalid::new(field, format!("expected {expected}"), found());
    }
    if message.starts_with("data did not match any variant") {
        return Invalid::new(field, "has the wrong type", found());
    }
    Invalid::new(field, shorten(&message, SHOWN_MESSAGE_CHARS), found())
}

/// The value at a deserializer's path in the document, when it is there.
pub(super) fn lookup<'a>(
    document: &'a Value,
    path: &serde_path_to_error::Path,
) -> Option<&'a Value> {
    use serde_path_to_error::Segment;

    path.iter()
        .try_fold(document, |value, segment| match segment {
            Segment::Seq { index } => value.get(*index),
            Segment::Map { key } => value.get(key.as_str()),
            Segment::Enum { .. } | Segment::Unknown => None,
        })
}

/// One step of a field path.
#[derive(Debug, Clone, Copy)]
pub(super) enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `spec.workdir.artifactMounts[0].mountPath`; odd keys are quoted (`labels["a.b/c"]`) and
/// the middle of a very deep path is elided.
pub(super) fn field_path(steps: &[Step<'_>]) -> String {
    let elided = if steps.len() > SHOWN_STEPS {
        (SHOWN_STEPS / 2)..(steps.len() - SHOWN_STEPS / 2)
    } else {
        0..0
    };
    let mut path = String::new();
    for (position, step) in steps.iter().enumerate() {
        if elided.contains(&position) {
            if position == elided.start {
                path.push_str(".…");
            }
            continue;
        }
        match step {
            Step::Key(key) => push_key(&mut path, key),
            Step::Index(index) => {
                let _ = write!(path, "[{index}]");
            }
        }
    }
    if path.is_empty() {
        path.push_str("document");
    }
    path
}

pub(super) fn push_key(path: &mut String, key: &str) {
    let plain = !key.is_empty()
        && key.len() <= SHOWN_CHARS
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '$' | '?'));
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&shown(key));
        path.push(']');
    }
}

/// A string as shown in an error: quoted, and cut after [`SHOWN_CHARS`] characters with its
/// length in bytes.
pub fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!(
            "{:?}… ({} bytes)",
            text.get(..cut).unwrap_or_default(),
            text.len()
        ),
    }
}

/// Text cut after `limit` characters, with its length in bytes.
pub(super) fn shorten(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        None => text.to_owned(),
        Some((cut, _)) => format!(
            "{}… ({} bytes)",
            text.get(..cut).unwrap_or_default(),
            text.len()
        ),
    }
}

/// A JSON value as shown in an error.
pub(super) fn shown_json(value: Option<&Value>) -> String {
    match value {
        None => NOTHING.to_owned(),
        Some(Value::String(text)) => shown(text),
        Some(other) => shorten(&other.to_string(), SHOWN_CHARS),
    }
}
