//! A subset of kubectl's JSONPath templates: `{.a.b}`, `{.items[*].metadata.name}`,
//! `{.a[0]}`, `{.a['key.with.dots']}`, `{range .items[*]}…{end}`, `{"\n"}`, and literal
//! text around them. Filters, slices and recursive descent are refused with a clear message.

use std::fmt::Write as _;

use serde_json::Value;

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A member of an object.
    Field(String),
    /// An element of an array; negative counts from the end.
    Index(i64),
    /// Every element of an array, or every value of an object.
    Wildcard,
}

/// A path such as `.items[*].metadata.name`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Path(pub Vec<Step>);

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Node>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Text(String),
    Path(Path),
    Range(Path, Vec<Node>),
}

/// Why a template cannot be used.
pub type ParseError = String;

impl Template {
    /// Parses `text` as a template.
    pub fn parse(text: &str) -> Result<Template, ParseError> {
        let mut stack: Vec<(Path, Vec<Node>)> = Vec::new();
        let mut nodes = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                nodes.push(Node::Text(rest.to_string()));
                break;
            };
            if open > 0 {
                nodes.push(Node::Text(rest[..open].to_string()));
            }
            let close = closing_brace(&rest[open..])
                .ok_or_else(|| format!("unclosed {{ in JSONPath template {text:?}"))?;
            let inner = rest[open + 1..open + close].trim();
            rest = &rest[open + close + 1..];
            if let Some(path) = inner.strip_prefix("range ") {
                stack.push((Path::parse(path.trim())?, std::mem::take(&mut nodes)));
            } else if inner == "end" {
                let (path, outer) = stack
                    .pop()
                    .ok_or_else(|| format!("{{end}} without {{range}} in {text:?}"))?;
                let body = std::mem::replace(&mut nodes, outer);
                nodes.push(Node::Range(path, body));
            } else if inner.starts_with('"') || inner.starts_with('\'') {
                nodes.push(Node::Text(string_literal(inner)?));
            } else {
                nodes.push(Node::Path(Path::parse(inner)?));
            }
        }
        if !stack.is_empty() {
            return Err(format!("{{range}} without {{end}} in {text:?}"));
        }
        Ok(Template(nodes))
    }

    /// The template filled in from `value`; missing fields print nothing.
    pub fn render(&self, value: &Value) -> String {
        let mut out = String::new();
        render_nodes(&self.0, value, &mut out);
        out
    }
}

fn render_nodes(nodes: &[Node], current: &Value, out: &mut String) {
    for node in nodes {
        match node {
            Node::Text(text) => out.push_str(text),
            Node::Path(path) => {
                let texts: Vec<String> = path.eval(current).into_iter().map(scalar_text).collect();
                out.push_str(&texts.join(" "));
            }
            Node::Range(path, body) => {
                for item in path.eval_items(current) {
                    render_nodes(body, item, out);
                }
            }
        }
    }
}

/// A value as JSONPath output shows it: strings raw, `null` empty, objects and arrays as
/// compact JSON.
pub fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The length of `{…}` at the start of `text` (the index of its `}`), skipping quoted parts.
fn closing_brace(text: &str) -> Option<usize> {
    closing(text, '}')
}

/// The index of the `close` that ends the group opened by the first character of `text`,
/// skipping quoted parts (a `}` or `]` in a quoted key does not end it).
fn closing(text: &str, close: char) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (index, c) in text.char_indices().skip(1) {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                c if c == close => return Some(index),
                _ => {}
            },
        }
    }
    None
}

/// `"text"` with the escapes `\n`, `\t`, `\r`, `\\` and the quote.
fn string_literal(inner: &str) -> Result<String, ParseError> {
    let mut chars = inner.chars();
    let quote = chars.next().unwrap_or('"');
    let mut out = String::new();
    let mut closed = false;
    while let Some(c) = chars.next() {
        if closed {
            return Err(format!("text after the string {inner}"));
        }
        match c {
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some(other) => out.push(other),
                None => return Err(format!("unfinished escape in {inner}")),
            },
            c if c == quote => closed = true,
            c => out.push(c),
        }
    }
    if !closed {
        return Err(format!("unclosed string {inner}"));
    }
    Ok(out)
}

impl Path {
    /// Parses `.a.b[0]['c'][*]` (a leading `$` or `@` is allowed).
    pub fn parse(text: &str) -> Result<Path, ParseError> {
        let mut steps = Vec::new();
        let body = text
            .strip_prefix('$')
            .or_else(|| text.strip_prefix('@'))
            .unwrap_or(text);
        let chars: Vec<char> = body.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '.' => {
                    i += 1;
                    if chars.get(i) == Some(&'.') {
                        return Err(format!("recursive descent (..) is not supported: {text:?}"));
                    }
                    if chars.get(i) == Some(&'*') {
                        steps.push(Step::Wildcard);
                        i += 1;
                        continue;
                    }
                    let start = i;
                    while i < chars.len() && !matches!(chars[i], '.' | '[') {
                        i += 1;
                    }
                    if i == start {
                        if i == chars.len() && steps.is_empty() && start == 1 {
                            break; // `{.}`: the value itself
                        }
                        return Err(format!("an empty field name in {text:?}"));
                    }
                    steps.push(Step::Field(chars[start..i].iter().collect()));
                }
                '[' => {
                    let rest: String = chars[i..].iter().collect();
                    let close = closing(&rest, ']')
                        .map(|at| i + rest[..at].chars().count())
                        .ok_or_else(|| format!("unclosed [ in {text:?}"))?;
                    let inner: String = chars[i + 1..close].iter().collect();
                    steps.push(bracket(inner.trim(), text)?);
                    i = close + 1;
                }
                other => {
                    return Err(format!(
                        "unexpected {other:?} in {text:?} (a path looks like .status.phase)"
                    ));
                }
            }
        }
        Ok(Path(steps))
    }

    /// Every value the path reaches from `root`, in order.
    pub fn eval<'v>(&self, root: &'v Value) -> Vec<&'v Value> {
        let mut current = vec![root];
        for step in &self.0 {
            let mut next = Vec::new();
            for value in current {
                match (step, value) {
                    (Step::Field(name), Value::Object(map)) => next.extend(map.get(name)),
                    (Step::Index(index), Value::Array(items)) => {
                        let len = i64::try_from(items.len()).unwrap_or(i64::MAX);
                        let at = if *index < 0 { len + index } else { *index };
                        if let Ok(at) = usize::try_from(at) {
                            next.extend(items.get(at));
                        }
                    }
                    (Step::Wildcard, Value::Array(items)) => next.extend(items),
                    (Step::Wildcard, Value::Object(map)) => next.extend(map.values()),
                    _ => {}
                }
            }
            current = next;
        }
        current
    }

    /// What `{range PATH}` iterates over: the values the path reaches, or the elements of an
    /// array it reaches without a final wildcard.
    fn eval_items<'v>(&self, root: &'v Value) -> Vec<&'v Value> {
        let values = self.eval(root);
        if self.0.last() != Some(&Step::Wildcard)
            && let [Value::Array(items)] = values.as_slice()
        {
            return items.iter().collect();
        }
        values
    }

    /// The path's values as one text (space-separated), or `None` when it reaches nothing.
    pub fn text(&self, root: &Value) -> Option<String> {
        let values = self.eval(root);
        if values.is_empty() {
            return None;
        }
        Some(
            values
                .into_iter()
                .map(scalar_text)
                .collect::<Vec<_>>()
                .join(" "),
        )
    }

    /// Whether the path starts under `.status` (what a finished resource no longer changes).
    pub fn reads_status(&self) -> bool {
        self.0.first() == Some(&Step::Field("status".to_string()))
    }

    /// The path as written in templates, `{.status.phase}`; a name that would not read back
    /// after a dot (empty, or with a dot, bracket, brace, quote, backslash, `*` or blank) is
    /// quoted, `['app.kubernetes.io/name']`, so that the text parses back to this path.
    pub fn display(&self) -> String {
        let mut out = String::from("{");
        for step in &self.0 {
            match step {
                Step::Field(name)
                    if name.is_empty()
                        || name.chars().any(|c| {
                            ".[]{}'\"\\*".contains(c) || c.is_whitespace() || c.is_control()
                        }) =>
                {
                    let quoted = name.replace('\\', "\\\\").replace('\'', "\\'");
                    let _ = write!(out, "['{quoted}']");
                }
                Step::Field(name) => {
                    let _ = write!(out, ".{name}");
                }
                Step::Index(index) => {
                    let _ = write!(out, "[{index}]");
                }
                Step::Wildcard => out.push_str("[*]"),
            }
        }
        if self.0.is_empty() {
            out.push('.');
        }
        out.push('}');
        out
    }
}

fn bracket(inner: &str, text: &str) -> Result<Step, ParseError> {
    if inner == "*" {
        return Ok(Step::Wildcard);
    }
    if inner.starts_with('?') {
        return Err(format!("filters ([?(…)]) are not supported: {text:?}"));
    }
    if inner.contains(':') && !(inner.starts_with('\'') || inner.starts_with('"')) {
        return Err(format!("slices ([a:b]) are not supported: {text:?}"));
    }
    if inner.starts_with('\'') || inner.starts_with('"') {
        return string_literal(inner).map(Step::Field);
    }
    inner
        .parse::<i64>()
        .map(Step::Index)
        .map_err(|_| format!("[{inner}] is neither an index, * nor a quoted key in {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: &str, value: &Value) -> String {
        Template::parse(template)
            .unwrap_or_else(|e| panic!("{template}: {e}"))
            .render(value)
    }

    #[test]
    fn renders_the_kubectl_forms() {
        let list = json!({
            "kind": "AgentRunList",
            "items": [
                {"metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "x"}}, "status": {"phase": "Succeeded", "turns": [{"model": "haiku"}, {"model": "sonnet"}]}},
                {"metadata": {"name": "b"}, "status": {"phase": "Running", "cost": {"totalUSD": "0.01"}}}
            ]
        });
        let cases = [
            ("{.kind}", "AgentRunList"),
            ("{.items[*].metadata.name}", "a b"),
            ("{.items[0].status.phase}", "Succeeded"),
            ("{.items[-1].metadata.name}", "b"),
            ("{.items[0].status.turns[1].model}", "sonnet"),
            ("{$.items[1].status.cost.totalUSD}", "0.01"),
            ("names: {.items[*].metadata.name}!", "names: a b!"),
            ("{.items[0].metadata.labels['app.kubernetes.io/name']}", "x"),
            ("{.items[0].status.turns[0]}", r#"{"model":"haiku"}"#),
            ("{.missing.field}", ""),
            ("{.items[7].metadata.name}", ""),
            (
                "{range .items[*]}{.metadata.name}={.status.phase}{\"\\n\"}{end}",
                "a=Succeeded\nb=Running\n",
            ),
            ("{range .items}{.metadata.name},{end}", "a,b,"),
            ("plain text", "plain text"),
        ];
        for (template, want) in cases {
            assert_eq!(render(template, &list), want, "{template}");
        }
    }

    #[test]
    fn scalars_print_raw() {
        let value = json!({"n": 3, "b": true, "s": "x y", "z": null, "a": [1, "two"]});
        assert_eq!(render("{.n} {.b} {.s} [{.z}]", &value), "3 true x y []");
        assert_eq!(render("{.a[*]}", &value), "1 two");
        assert_eq!(render("{.}", &json!("root")), "root");
        assert_eq!(render("{.a.*}", &json!({"a": {"x": 1, "y": 2}})), "1 2");
    }

    #[test]
    fn unsupported_or_broken_templates_say_why() {
        for (template, hint) in [
            ("{.items[?(@.x==1)]}", "filters"),
            ("{..name}", "recursive descent"),
            ("{.items[0:2]}", "slices"),
            ("{.a", "unclosed {"),
            ("{.a[0}", "unclosed ["),
            ("{range .items[*]}{.x}", "without {end}"),
            ("{end}", "without {range}"),
            ("{.a[x]}", "neither an index"),
            ("{status}", "unexpected"),
            ("{.a..b}", "recursive descent"),
        ] {
            let error = Template::parse(template).expect_err(template);
            assert!(error.contains(hint), "{template}: {error}");
        }
    }

    #[test]
    fn displayed_paths_with_any_key_parse_back() {
        // Found by fuzz_a_displayed_path_parses_back_to_itself: a key with a quote, bracket
        // or brace was shown in a form that did not parse (`{.'}`, `['a]b']` cut at the first
        // `]`), in the messages of `wait --for`.
        for name in [
            "'",
            "a]b",
            "x}y",
            "it's",
            "back\\slash",
            "",
            " a",
            "*",
            "a.b",
            "[0]",
        ] {
            let path = Path(vec![
                Step::Field("metadata".into()),
                Step::Field(name.into()),
            ]);
            let shown = path.display();
            let inner = &shown[1..shown.len() - 1];
            assert_eq!(Path::parse(inner).as_ref(), Ok(&path), "{shown}");
            let value = json!({"metadata": {name: "found"}});
            let template = Template::parse(&shown).unwrap_or_else(|e| panic!("{shown}: {e}"));
            assert_eq!(template.render(&value), "found", "{shown}");
        }
        assert_eq!(
            Path::parse("['a]b'].c").expect("a quoted ]"),
            Path(vec![Step::Field("a]b".into()), Step::Field("c".into())])
        );
    }

    #[test]
    fn paths_report_text_and_whether_they_read_status() {
        let path = Path::parse(".status.phase").expect("valid");
        assert!(path.reads_status());
        assert_eq!(path.display(), "{.status.phase}");
        assert_eq!(
            path.text(&json!({"status": {"phase": "Failed"}})),
            Some("Failed".into())
        );
        assert_eq!(path.text(&json!({"status": {}})), None);
        assert!(!Path::parse(".metadata.name").expect("valid").reads_status());
    }
}

/// Property-based fuzzing of `-o jsonpath=` templates: any text parses or says why, never
/// panics; a parsed template renders any value; a path written as templates show it parses
/// back to itself.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 40, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                prop::collection::btree_map("[a-c.'\\]\\[ ]{0,3}|items|metadata|name", inner, 0..5)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// Templates made of the pieces templates are made of, in any order.
    fn template_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("{.".to_string()),
            Just("{range ".to_string()),
            Just("{end}".to_string()),
            Just("[*]".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just("'".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("..".to_string()),
            Just("$".to_string()),
            Just("@".to_string()),
            Just("?(".to_string()),
            Just(":".to_string()),
            Just(".items".to_string()),
            Just(".metadata.name".to_string()),
            any::<i64>().prop_map(|i| format!("[{i}]")),
            "\\PC{0,6}",
        ];
        prop::collection::vec(piece, 0..16).prop_map(|pieces| pieces.concat())
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => prop_oneof!["[a-z]{1,6}", "\\PC{0,8}", "[a-c.'\"\\]\\[{}\\\\ *$@?:-]{0,6}"].prop_map(Step::Field),
            1 => any::<i64>().prop_map(Step::Index),
            1 => Just(Step::Wildcard),
        ]
    }

    proptest! {
        #[test]
        fn fuzz_any_template_parses_or_says_why(
            text in prop_oneof![template_text(), "\\PC{0,40}", ".{0,40}"],
            value in any_json(),
        ) {
            match Template::parse(&text) {
                Ok(template) => {
                    let _ = template.render(&value);
                }
                Err(error) => prop_assert!(!error.is_empty()),
            }
            if let Ok(path) = Path::parse(&text) {
                let _ = path.text(&value);
                let _ = path.eval_items(&value);
            }
        }

        #[test]
        fn fuzz_a_displayed_path_parses_back_to_itself(
            steps in prop::collection::vec(step(), 0..6),
            value in any_json(),
        ) {
            let path = Path(steps);
            let shown = path.display();
            let inner = shown
                .strip_prefix('{')
                .and_then(|s| s.strip_suffix('}'))
                .expect("braces");
            let parsed = Path::parse(inner)
                .map_err(|e| TestCaseError::fail(format!("{shown} does not parse: {e}")))?;
            prop_assert_eq!(&parsed, &path, "{}", shown);
            let template = Template::parse(&shown)
                .map_err(|e| TestCaseError::fail(format!("{shown} is not a template: {e}")))?;
            prop_assert_eq!(
                template.render(&value),
                path.text(&value).unwrap_or_default(),
                "{}",
                shown
            );
        }
    }
}
