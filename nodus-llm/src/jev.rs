//! The built-in router `jev`: picks a model family per prompt from cheap local features, in
//! about a microsecond, with no model call (so routing costs nothing).
//!
//! The features: the prompt's length; code in it (fences, code-shaped lines, compiler errors
//! and stack traces); words that signal reasoning (design, debug, race, trade-offs…), the most
//! demanding work (prove, formal, consensus, from scratch, research…), tool use (run, install,
//! test…) and simple requests (what is, translate, hello…); how many clauses the request
//! has; and the conversation so far (tool round trips and turns, and the task it started
//! with, so that a short "continue" in a demanding task stays with a large model). Each
//! feature adds integer points; the total picks the family by threshold. No float is used.
//!
//! The agent's `families` restriction applies first: among the allowed families, the
//! smallest one at least as large as the choice answers, else the largest allowed one. The
//! engine keeps the chosen model for the whole turn and falls back to `sonnet` when routing
//! fails or times out. `examples/router_eval.rs` measures it against a labelled set.

use async_trait::async_trait;
use nodus_core::catalog::Family;
use nodus_core::model::{ChatMessage, ContentBlock, Role};
use nodus_core::router::{self, RouteChoice, RouteRequest, Router};

/// The most of a prompt that is read for words (its length counts whole).
const READ_BYTES: usize = 8 * 1024;

/// What jev sees in a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// Bytes of the prompt.
    pub bytes: usize,
    /// Words of the prompt (read part).
    pub words: u32,
    /// Code fences (```).
    pub fences: u32,
    /// Lines that look like code.
    pub code_lines: u32,
    /// Compiler errors, stack traces, crashes.
    pub error_signals: u32,
    /// Words that signal reasoning.
    pub reasoning: u32,
    /// Words and phrases that signal the most demanding work.
    pub demanding: u32,
    /// Words that signal work with tools.
    pub tools: u32,
    /// Words that ask for something to be made (write, implement, fix…).
    pub making: u32,
    /// Words that signal a simple request.
    pub simple: u32,
    /// Clauses: commas, semicolons, colons, sentence ends and "and"/"then".
    pub clauses: u32,
    /// Tool results in the conversation so far.
    pub history_tool_results: u32,
    /// Messages in the conversation so far.
    pub history_messages: u32,
}

/// Score thresholds: below `sonnet` → haiku, below `opus` → sonnet, below `fable` → opus,
/// else fable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// The least score for sonnet.
    pub sonnet: i32,
    /// The least score for opus.
    pub opus: i32,
    /// The least score for fable.
    pub fable: i32,
}

impl Default for Thresholds {
    fn default() -> Self {
        // Fitted with `cargo run -p nodus-llm --example router_eval -- --fit` on half of the
        // labelled set (see BENCHMARKS.md for the held-out half).
        Thresholds {
            sonnet: 0,
            opus: 10,
            fable: 24,
        }
    }
}

/// The router jev.
#[derive(Debug, Clone, Copy, Default)]
pub struct Jev {
    thresholds: Thresholds,
}

/// jev's decision with its reasons (for the evaluation and for logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The family before the agent's restriction.
    pub preferred: Family,
    /// The family that answers (within the allowed ones).
    pub family: Family,
    /// The score of the prompt.
    pub score: i32,
    /// The score carried over from the task the conversation started with.
    pub task_score: i32,
    /// The prompt's features.
    pub features: Features,
}

impl Jev {
    /// jev with its default thresholds.
    pub fn new() -> Self {
        Jev::default()
    }

    /// jev with other thresholds.
    pub fn with_thresholds(thresholds: Thresholds) -> Self {
        Jev { thresholds }
    }

    /// Decide, with reasons; `None` when no family is allowed.
    pub fn decide(&self, request: &RouteRequest<'_>) -> Option<Decision> {
        let mut features = features(request.prompt);
        let mut task: Option<&str> = None;
        for message in request.conversation {
            features.history_messages = features.history_messages.saturating_add(1);
            for block in &message.content {
                match block {
                    ContentBlock::ToolResult { .. } => {
                        features.history_tool_results =
                            features.history_tool_results.saturating_add(1);
                    }
                    ContentBlock::Text { text } if task.is_none() && message.role == Role::User => {
                        task = Some(text);
                    }
                    _ => {}
                }
            }
        }
        let score = score(&features);
        // The task the conversation began with keeps its weight, a little discounted.
        let task_score = task.map_or(i32::MIN, |task| score_text(task).saturating_sub(2));
        let preferred = self.family_for(score.max(task_score));
        let family = restrict(preferred, request.allowed)?;
        Some(Decision {
            preferred,
            family,
            score,
            task_score,
            features,
        })
    }

    fn family_for(&self, score: i32) -> Family {
        self.thresholds.family_for(score)
    }
}

impl Thresholds {
    /// The family of a score.
    pub fn family_for(&self, score: i32) -> Family {
        let t = self;
        if score >= t.fable {
            Family::Fable
        } else if score >= t.opus {
            Family::Opus
        } else if score >= t.sonnet {
            Family::Sonnet
        } else {
            Family::Haiku
        }
    }
}

#[async_trait]
impl Router for Jev {
    async fn route(&self, request: &RouteRequest<'_>) -> Result<RouteChoice, router::Error> {
        let decision = self
            .decide(request)
            .ok_or_else(|| router::Error("no family is allowed".to_string()))?;
        Ok(RouteChoice {
            family: decision.family,
            call: None,
        })
    }
}

/// The smallest allowed family at least as large as `preferred`, else the largest allowed.
pub fn restrict(preferred: Family, allowed: &[Family]) -> Option<Family> {
    allowed
        .iter()
        .copied()
        .filter(|family| *family >= preferred)
        .min()
        .or_else(|| allowed.iter().copied().max())
}

/// Score a text on its own (no conversation).
pub fn score_text(text: &str) -> i32 {
    score(&features(text))
}

fn points(count: u32, each: i32, cap: u32) -> i32 {
    i32::try_from(count.min(cap)).unwrap_or(0) * each
}

/// The points of a request's features.
pub fn score(f: &Features) -> i32 {
    let length = match f.bytes {
        0..80 => -2,
        80..160 => 0,
        160..300 => 2,
        300..600 => 4,
        600..1200 => 6,
        1200..4000 => 8,
        _ => 10,
    };
    let code = points(f.fences, 2, 2) + points(f.code_lines, 1, 6) + points(f.error_signals, 2, 2);
    let simple = if f.bytes < 200 {
        points(f.simple, -3, 2)
    } else {
        0
    };
    let history = match f.history_tool_results {
        0 => 0,
        1..4 => 1,
        4..10 => 3,
        _ => 5,
    } + if f.history_messages >= 20 { 2 } else { 0 };
    length
        + code
        + simple
        + history
        + points(f.reasoning, 3, 6)
        + points(f.demanding, 5, 6)
        + points(f.tools, 1, 4)
        + points(f.making, 2, 2)
        + points(f.clauses, 1, 12) / 2
}

/// Stems of words that signal reasoning.
const REASONING: &[&str] = &[
    "analy",
    "design",
    "architect",
    "trade",
    "optimi",
    "profil",
    "concurren",
    "race",
    "deadlock",
    "leak",
    "latency",
    "throughput",
    "scal",
    "secur",
    "vulnerab",
    "threat",
    "audit",
    "migrat",
    "refactor",
    "invariant",
    "idempot",
    "consisten",
    "distribut",
    "rebalanc",
    "shard",
    "replica",
    "debug",
    "diagnos",
    "investigat",
    "root",
    "regress",
    "intermittent",
    "flaky",
    "atomic",
    "ordering",
    "partition",
    "correct",
    "complexity",
    "recurrence",
    "benchmark",
    "compare",
    "recommend",
    "justify",
    "evaluat",
    "strategy",
    "tune",
    "garbage",
    "fuzz",
    "property",
    "reverse",
    "interpreter",
    "parser",
    "lock",
    "memory",
    "exploit",
    "drift",
    "cause",
];

/// Stems of words that signal the most demanding work.
const DEMANDING: &[&str] = &[
    "prove",
    "proof",
    "theorem",
    "formal",
    "linearizab",
    "byzantine",
    "consensus",
    "raft",
    "paxos",
    "compiler",
    "novel",
    "research",
    "invent",
    "soundness",
    "mechanized",
    "semantics",
    "approximation",
    "cryptograph",
    "certified",
    "jepsen",
    "lsm",
    "mvcc",
    "tla",
    "coq",
    "lean",
    "monomorphization",
    "jit",
    "zero",
    "verified",
    "kernel",
    "datasets",
    "roadmap",
    "complete",
    "full",
    "rigorous",
    "simulat",
    "regulat",
    "autonomous",
];

/// Phrases that signal the most demanding work.
const DEMANDING_PHRASES: &[&str] = &[
    "from scratch",
    "end-to-end",
    "state of the art",
    "state-of-the-art",
    "production-ready",
    "np-hard",
    "operating system",
    "model-check",
    "prove or disprove",
    "entire",
];

/// Stems of words that ask for something to be made.
const MAKING: &[&str] = &[
    "write",
    "implement",
    "creat",
    "build",
    "fix",
    "add",
    "explain",
    "generat",
    "rewrit",
    "translat",
    "set",
    "review",
    "parse",
];

/// Stems of words that signal tool use.
const TOOLS: &[&str] = &[
    "run", "execut", "install", "test", "build", "compil", "shell", "command", "script", "file",
    "director", "grep", "git", "docker", "deploy", "cargo", "npm", "pip", "pytest", "make",
];

/// Words that signal a simple request (matched whole).
const SIMPLE: &[&str] = &[
    "what",
    "what's",
    "whats",
    "hello",
    "hi",
    "thanks",
    "thank",
    "capital",
    "define",
    "synonym",
    "translate",
    "convert",
    "spell",
    "uppercase",
    "lowercase",
    "echo",
    "version",
    "joke",
    "plural",
    "opposite",
    "stand",
    "how many",
    "which",
    "print",
    "show",
    "list",
    "count",
];

const REASONING_BIT: u8 = 1;
const DEMANDING_BIT: u8 = 2;
const TOOLS_BIT: u8 = 4;
const MAKING_BIT: u8 = 8;
const SIMPLE_BIT: u8 = 16;

/// The word lists indexed by first letter: (stem, category, whole word only).
type Index = [Vec<(&'static str, u8, bool)>; 26];

static INDEX: std::sync::LazyLock<Index> = std::sync::LazyLock::new(|| {
    let mut index: Index = Default::default();
    let lists: [(&[&'static str], u8, bool); 5] = [
        (REASONING, REASONING_BIT, false),
        (DEMANDING, DEMANDING_BIT, false),
        (TOOLS, TOOLS_BIT, false),
        (MAKING, MAKING_BIT, false),
        (SIMPLE, SIMPLE_BIT, true),
    ];
    for (list, bit, whole) in lists {
        for stem in list {
            if let Some(slot) = stem
                .bytes()
                .next()
                .and_then(|b| b.checked_sub(b'a'))
                .and_then(|i| index.get_mut(usize::from(i)))
            {
                slot.push((stem, bit, whole));
            }
        }
    }
    index
});

/// The categories a (lower-case) word belongs to.
fn classify(word: &str) -> u8 {
    let Some(entries) = word
        .bytes()
        .next()
        .and_then(|b| b.checked_sub(b'a'))
        .and_then(|i| INDEX.get(usize::from(i)))
    else {
        return 0;
    };
    let mut mask = 0;
    for &(stem, bit, whole) in entries {
        if (whole && word == stem) || (!whole && word.starts_with(stem)) {
            mask |= bit;
        }
    }
    mask
}

/// The features of a prompt.
pub fn features(prompt: &str) -> Features {
    let mut end = prompt.len().min(READ_BYTES);
    while !prompt.is_char_boundary(end) {
        end -= 1;
    }
    let read = &prompt[..end];
    let mut f = Features {
        bytes: prompt.len(),
        ..Features::default()
    };
    for line in read.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            f.fences += 1;
            continue;
        }
        if looks_like_code(trimmed) {
            f.code_lines += 1;
        }
    }
    f.fences /= 2;
    let lower = read.to_ascii_lowercase();
    for signal in [
        "error[e",
        "traceback",
        "panicked",
        "exception",
        "segfault",
        "core dump",
        "backtrace",
        "stack trace",
    ] {
        if lower.contains(signal) {
            f.error_signals += 1;
        }
    }
    for phrase in DEMANDING_PHRASES {
        if lower.contains(phrase) {
            f.demanding += 1;
        }
    }
    for byte in lower.bytes() {
        if matches!(byte, b',' | b';' | b':' | b'.' | b'?' | b'!') {
            f.clauses += 1;
        }
    }
    for word in lower.split(|c: char| !(c.is_ascii_alphanumeric() || c == '\'' || c == '+')) {
        if word.is_empty() {
            continue;
        }
        f.words += 1;
        if word == "and" || word == "then" {
            f.clauses += 1;
            continue;
        }
        let mask = classify(word);
        f.reasoning += u32::from(mask & REASONING_BIT != 0);
        f.demanding += u32::from(mask & DEMANDING_BIT != 0);
        f.tools += u32::from(mask & TOOLS_BIT != 0);
        f.making += u32::from(mask & MAKING_BIT != 0);
        f.simple += u32::from(mask & SIMPLE_BIT != 0);
    }
    f
}

fn looks_like_code(line: &str) -> bool {
    line.ends_with(';')
        || line.ends_with('{')
        || line.ends_with('}')
        || line.ends_with(':')
            && (line.starts_with("def ") || line.starts_with("for ") || line.starts_with("if "))
        || line.contains("=>")
        || line.contains("::")
        || line.starts_with("fn ")
        || line.starts_with("def ")
        || line.starts_with("return ")
        || line.starts_with("import ")
        || line.starts_with("#include")
        || line.starts_with("#0 ")
        || line.starts_with("#1 ")
}

/// Messages for a synthetic conversation (the evaluation's labelled follow-ups): the task,
/// then `turns` exchanges of which `tool_results` carry a tool round trip.
pub fn synthetic_history(task: &str, turns: u32, tool_results: u32) -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage {
        role: Role::User,
        content: vec![ContentBlock::Text {
            text: task.to_string(),
        }],
    }];
    for turn in 0..turns {
        if turn < tool_results {
            messages.push(ChatMessage {
                role: Role::Assistant,
                content: vec![ContentBlock::ToolUse {
                    id: format!("toolu_{turn}"),
                    name: "shell".to_string(),
                    input: serde_json::json!({"command": "make test"}),
                }],
            });
            messages.push(ChatMessage {
                role: Role::User,
                content: vec![ContentBlock::ToolResult {
                    tool_use_id: format!("toolu_{turn}"),
                    content: "ok".to_string(),
                    is_error: false,
                }],
            });
        } else {
            messages.push(ChatMessage {
                role: Role::Assistant,
                content: vec![ContentBlock::Text {
                    text: "Done; what next?".to_string(),
                }],
            });
            messages.push(ChatMessage {
                role: Role::User,
                content: vec![ContentBlock::Text {
                    text: "Go on.".to_string(),
                }],
            });
        }
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(prompt: &str, allowed: &[Family]) -> Family {
        let request = RouteRequest {
            prompt,
            conversation: &[],
            allowed,
        };
        Jev::new()
            .decide(&request)
            .map(|d| d.family)
            .expect("allowed")
    }

    #[test]
    fn simple_prompts_go_small_and_demanding_ones_large() {
        assert_eq!(
            route("What is the capital of France?", &Family::ALL),
            Family::Haiku
        );
        assert_eq!(
            route(
                "Write a Python function that parses ISO dates, with tests, and run them.",
                &Family::ALL
            ),
            Family::Sonnet
        );
        assert_eq!(
            route(
                "Prove that this consensus protocol is linearizable under partitions, write a \
                 formal TLA+ specification, model-check it, and implement it from scratch with a \
                 Jepsen-style test harness and a research-grade evaluation.",
                &Family::ALL
            ),
            Family::Fable
        );
    }

    #[test]
    fn the_agents_families_restrict_the_choice() {
        let demanding = "Prove the soundness of this type system formally, from scratch, with a \
                         mechanized proof in Coq and a certified checker, then compare it.";
        assert_eq!(route(demanding, &Family::ALL), Family::Fable);
        assert_eq!(
            route(demanding, &[Family::Haiku, Family::Sonnet]),
            Family::Sonnet
        );
        assert_eq!(
            route("hello", &[Family::Opus, Family::Sonnet]),
            Family::Sonnet
        );
        assert_eq!(route("hello", &[Family::Opus]), Family::Opus);
        let none = RouteRequest {
            prompt: "hello",
            conversation: &[],
            allowed: &[],
        };
        assert!(Jev::new().decide(&none).is_none());
    }

    #[test]
    fn a_short_follow_up_keeps_the_weight_of_its_task() {
        let task = "Design and implement from scratch a distributed key-value store with Raft \
                    consensus, prove linearizability, and build a Jepsen-style harness.";
        let history = synthetic_history(task, 12, 10);
        let request = RouteRequest {
            prompt: "Continue.",
            conversation: &history,
            allowed: &Family::ALL,
        };
        let decision = Jev::new().decide(&request).expect("allowed");
        assert_eq!(decision.family, Family::Fable);
        assert_eq!(decision.features.history_tool_results, 10);
        assert_eq!(route("Continue.", &Family::ALL), Family::Haiku);
    }

    #[test]
    fn any_input_is_decided_without_panicking() {
        let long = "é".repeat(100_000);
        for prompt in ["", " ", "```", "\u{0}\u{fffd}", long.as_str(), "a\u{301}"] {
            assert!(
                Jev::new()
                    .decide(&RouteRequest {
                        prompt,
                        conversation: &[],
                        allowed: &Family::ALL
                    })
                    .is_some()
            );
        }
    }

    #[tokio::test]
    async fn the_router_trait_answers_without_a_call() {
        let choice = Jev::new()
            .route(&RouteRequest {
                prompt: "hi",
                conversation: &[],
                allowed: &Family::ALL,
            })
            .await
            .expect("routed");
        assert_eq!(
            choice,
            RouteChoice {
                family: Family::Haiku,
                call: None
            }
        );
        assert_eq!(Jev::new().max_cost(), nodus_core::Usd::ZERO);
    }
}
