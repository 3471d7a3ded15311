//! Per-session tasks (docs/design.md 3.4): the numbered tool-call steps each session must
//! follow, the user message that lists them, and the ctx filler of earlier conversation
//! placed before it. Everything here is a pure function of the workload and the session
//! index (ChaCha8 seeded from `workload.seed`, the index and a purpose tag), so both arms
//! of an experiment, and every rerun, see exactly the same conversations.

use crate::classify::ExpectedCall;
use crate::session::ChatMessage;
use crate::workload::{TaskSpec, ToolSpec, Workload};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value};

/// What a session-seeded random stream is used for; separate streams keep the task
/// identical when the filler generator changes, and vice versa.
#[derive(Debug, Clone, Copy)]
#[repr(u64)]
pub enum Purpose {
    Task = 1,
    Filler = 2,
}

/// The deterministic random stream for one session and purpose.
pub(crate) fn session_rng(seed: u64, session_index: u32, purpose: Purpose) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&u64::from(session_index).to_le_bytes());
    key[16..24].copy_from_slice(&(purpose as u64).to_le_bytes());
    ChaCha8Rng::from_seed(key)
}

/// One step of a task: the tool call the session must make next. `args` keeps the
/// schema's property order (serde_json preserves insertion order in this crate).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub tool: String,
    pub args: Map<String, Value>,
}

impl Step {
    /// The call as it appears in the numbered list: `read_file(path="/a", max_lines=40)`.
    pub(crate) fn render_call(&self) -> String {
        render_call(&self.tool, &self.args)
    }

    /// What the classifier compares the model's call against.
    pub fn expected(&self) -> ExpectedCall {
        ExpectedCall {
            tool: self.tool.clone(),
            args: self.args.clone(),
        }
    }
}

/// A session's task: `steps` tool calls, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub steps: Vec<Step>,
}

impl Task {
    /// The task of session `session_index` (0-based), drawn from the workload's tools and
    /// their `arg_values` pools.
    pub(crate) fn generate(workload: &Workload, session_index: u32) -> Task {
        let mut rng = session_rng(workload.seed, session_index, Purpose::Task);
        let usable: Vec<&ToolSpec> = workload.tools.iter().collect();
        let steps = if usable.is_empty() {
            Vec::new()
        } else {
            (0..workload.task.steps)
                .map(|_| {
                    let tool = usable[rng.random_range(0..usable.len())];
                    draw_step(tool, &mut rng)
                })
                .collect()
        };
        Task { steps }
    }

    /// The task user message: intro, the numbered list (one call per line), outro.
    pub(crate) fn render_message(&self, spec: &TaskSpec) -> String {
        let list: Vec<String> = self
            .steps
            .iter()
            .enumerate()
            .map(|(i, step)| format!("{}. {}", i + 1, step.render_call()))
            .collect();
        let mut parts = Vec::with_capacity(3);
        if !spec.intro.trim().is_empty() {
            parts.push(spec.intro.trim_end().to_string());
        }
        parts.push(list.join("\n"));
        if !spec.outro.trim().is_empty() {
            parts.push(spec.outro.trim().to_string());
        }
        parts.join("\n\n")
    }

    /// The expected call for step `step` (0-based); `None` once all steps are done.
    pub fn expected(&self, step: usize) -> Option<ExpectedCall> {
        self.steps.get(step).map(Step::expected)
    }
}

/// Argument names of a tool in the order calls are rendered: the schema's
/// `properties` in the order the workload file declares them, restricted to names with
/// a non-empty value pool.
pub(crate) fn argument_order(tool: &ToolSpec) -> Vec<String> {
    tool.property_names()
        .into_iter()
        .filter(|name| {
            tool.arg_values
                .get(*name)
                .is_some_and(|pool| !pool.is_empty())
        })
        .map(str::to_string)
        .collect()
}

fn draw_step(tool: &ToolSpec, rng: &mut ChaCha8Rng) -> Step {
    let mut args = Map::new();
    for name in argument_order(tool) {
        if let Some(value) = tool.arg_values.get(&name).and_then(|pool| pool.choose(rng)) {
            args.insert(name, value.clone());
        }
    }
    Step {
        tool: tool.name.clone(),
        args,
    }
}

/// `name(a=JSON, b=JSON)` with arguments in map order; strings JSON-quoted and escaped.
pub(crate) fn render_call(tool: &str, args: &Map<String, Value>) -> String {
    let rendered: Vec<String> = args
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    format!("{tool}({})", rendered.join(", "))
}

/// Parses the numbered list of a task message back into (tool, args) pairs, in list
/// order. Lines that are not `N. tool(name=JSON, ...)` are ignored; `None` when the text
/// holds no such line. Used by tests to check rendering.
#[cfg(test)]
pub(crate) fn parse_task_message(text: &str) -> Option<Vec<(String, Map<String, Value>)>> {
    let mut calls = Vec::new();
    for line in text.lines() {
        if let Some(call) = parse_numbered_line(line.trim()) {
            calls.push(call);
        }
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
fn parse_numbered_line(line: &str) -> Option<(String, Map<String, Value>)> {
    let dot = line.find(". ")?;
    if dot == 0 || !line[..dot].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let call = &line[dot + 2..];
    let open = call.find('(')?;
    let tool = &call[..open];
    if tool.is_empty()
        || !tool
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return None;
    }
    let mut rest = call[open + 1..].trim_start();
    let mut args = Map::new();
    loop {
        if let Some(after) = rest.strip_prefix(')') {
            return after.trim().is_empty().then(|| (tool.to_string(), args));
        }
        let eq = rest.find('=')?;
        let name = rest[..eq].trim();
        if name.is_empty() {
            return None;
        }
        let text = rest[eq + 1..].trim_start();
        let end = json_value_end(text)?;
        let value: Value = serde_json::from_str(&text[..end]).ok()?;
        args.insert(name.to_string(), value);
        rest = text[end..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after.trim_start();
        }
    }
}

/// Byte length of the JSON value at the start of `text`: a string up to its closing
/// quote, an array/object up to its matching bracket, a scalar up to `,` or `)`.
#[cfg(test)]
fn json_value_end(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b',' | b')' if depth == 0 => return Some(i),
            _ => {}
        }
    }
    None
}

/// Approximate token count: every run of letters/digits is one token, every other
/// non-space character another (close to BPE counts for prose, logs and paths).
pub(crate) fn approx_tokens(text: &str) -> usize {
    let mut tokens = 0;
    let mut in_word = false;
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' {
            if !in_word {
                tokens += 1;
                in_word = true;
            }
        } else {
            in_word = false;
            if !c.is_whitespace() {
                tokens += 1;
            }
        }
    }
    tokens
}

const FALLBACK_PATHS: &[&str] = &[
    "/srv/app/config.yaml",
    "/var/log/nginx/error.log",
    "/etc/systemd/system/sglang-decode.service",
    "/srv/models/deepseek/tokenizer.json",
    "/var/lib/app/state.db",
    "/opt/serve/launch_prefill.sh",
];
const SERVICES: &[&str] = &[
    "sglang-prefill",
    "sglang-decode",
    "router",
    "nginx",
    "redis",
    "scheduler",
    "hicache-loader",
];
const HOSTS: &[&str] = &[
    "gpu-node-03",
    "gpu-node-07",
    "edge-lb-1",
    "ops-bastion",
    "gpu-node-12",
];
const LEVELS: &[&str] = &["INFO", "WARN", "ERROR", "DEBUG"];
const EVENTS: &[&str] = &[
    "retry after upstream reset",
    "slow request",
    "kv pool usage high",
    "health check passed",
    "evicted idle prefix pages",
    "config reloaded",
    "request queued",
    "checkpoint shard loaded",
];

/// Values the filler draws from: the workload's own pools (so long contexts hold
/// lookalike calls and paths) plus a few generic ones.
struct FillerVocabulary<'a> {
    tools: &'a [ToolSpec],
    strings: Vec<String>,
}

impl<'a> FillerVocabulary<'a> {
    fn new(tools: &'a [ToolSpec]) -> Self {
        let mut strings: Vec<String> = tools
            .iter()
            .flat_map(|t| t.arg_values.values().flatten())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        strings.extend(FALLBACK_PATHS.iter().map(|s| s.to_string()));
        FillerVocabulary { tools, strings }
    }

    fn string(&self, rng: &mut ChaCha8Rng) -> String {
        self.strings[rng.random_range(0..self.strings.len())].clone()
    }

    /// A call that looks like a task step, with values drawn independently.
    fn lookalike_call(&self, rng: &mut ChaCha8Rng) -> String {
        match self.tools.choose(rng) {
            Some(tool) => draw_step(tool, rng).render_call(),
            None => format!("cat {}", self.string(rng)),
        }
    }
}

fn pick<'s>(rng: &mut ChaCha8Rng, items: &[&'s str]) -> &'s str {
    items[rng.random_range(0..items.len())]
}

fn timestamp(rng: &mut ChaCha8Rng) -> String {
    format!(
        "2025-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        rng.random_range(1..=12),
        rng.random_range(1..=28),
        rng.random_range(0..24),
        rng.random_range(0..60),
        rng.random_range(0..60)
    )
}

fn log_excerpt(rng: &mut ChaCha8Rng, vocab: &FillerVocabulary<'_>) -> String {
    let lines = rng.random_range(2..=4);
    let host = pick(rng, HOSTS);
    let mut out = format!("Log excerpt from {host}:");
    for _ in 0..lines {
        let line = format!(
            "\n{} {} {}[{}]: {} path={} latency_ms={} running={}",
            timestamp(rng),
            pick(rng, LEVELS),
            pick(rng, SERVICES),
            rng.random_range(1000..60000),
            pick(rng, EVENTS),
            vocab.string(rng),
            rng.random_range(1..5000),
            rng.random_range(0..128)
        );
        out.push_str(&line);
    }
    out
}

fn user_sentence(rng: &mut ChaCha8Rng, vocab: &FillerVocabulary<'_>) -> String {
    match rng.random_range(0..6) {
        0 => format!(
            "Can you check {}? The deploy at {} left it with {} lines.",
            vocab.string(rng),
            timestamp(rng),
            rng.random_range(10..4000)
        ),
        1 => log_excerpt(rng, vocab),
        2 => format!(
            "Yesterday someone ran {} and the numbers looked off.",
            vocab.lookalike_call(rng)
        ),
        3 => format!(
            "The runbook says to look at {} before touching {} on {}.",
            vocab.string(rng),
            vocab.string(rng),
            pick(rng, HOSTS)
        ),
        4 => format!(
            "{} restarted {} times overnight; p99 went from {} ms to {} ms.",
            pick(rng, SERVICES),
            rng.random_range(2..9),
            rng.random_range(80..300),
            rng.random_range(400..3000)
        ),
        _ => format!(
            "Is max_lines={} enough for {}, or should we grep for {} instead?",
            rng.random_range(10..200),
            vocab.string(rng),
            pick(rng, EVENTS)
        ),
    }
}

fn assistant_sentence(rng: &mut ChaCha8Rng, vocab: &FillerVocabulary<'_>) -> String {
    match rng.random_range(0..6) {
        0 => format!(
            "I ran {} earlier; it returned {} lines and nothing unusual.",
            vocab.lookalike_call(rng),
            rng.random_range(1..500)
        ),
        1 => format!(
            "Looking at {}, the {} config sets max_running_requests to {}.",
            vocab.string(rng),
            pick(rng, SERVICES),
            rng.random_range(8..256)
        ),
        2 => format!(
            "That matches the alert at {}: {} on {} reported \"{}\".",
            timestamp(rng),
            pick(rng, SERVICES),
            pick(rng, HOSTS),
            pick(rng, EVENTS)
        ),
        3 => format!(
            "Next I would call {} and compare it with {}.",
            vocab.lookalike_call(rng),
            vocab.string(rng)
        ),
        4 => format!(
            "The checksum of {} is {:08x}, same as on {}.",
            vocab.string(rng),
            rng.random::<u32>(),
            pick(rng, HOSTS)
        ),
        _ => format!(
            "Queue depth peaked at {} with {} running; the token usage was {:.2}.",
            rng.random_range(0..64),
            rng.random_range(1..128),
            rng.random_range(0.1..0.99)
        ),
    }
}

/// `ctx` tokens (approximately, see [`approx_tokens`]) of earlier conversation for
/// session `session_index`: alternating user/assistant messages, starting with a user
/// message and ending with an assistant one, so the task message follows naturally.
/// The total reaches `ctx` and overshoots it by at most one sentence.
pub fn filler(workload: &Workload, session_index: u32) -> Vec<ChatMessage> {
    let budget = workload.ctx as usize;
    let mut messages = Vec::new();
    if budget == 0 {
        return messages;
    }
    let mut rng = session_rng(workload.seed, session_index, Purpose::Filler);
    let vocab = FillerVocabulary::new(&workload.tools);
    let mut used = 0usize;
    while used < budget {
        let user = messages.len() % 2 == 0;
        let target = rng.random_range(30..160).min(budget - used);
        let mut text = String::new();
        let mut tokens = 0usize;
        while tokens < target.max(1) {
            let sentence = if user {
                user_sentence(&mut rng, &vocab)
            } else {
                assistant_sentence(&mut rng, &vocab)
            };
            tokens += approx_tokens(&sentence);
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&sentence);
        }
        used += tokens;
        messages.push(ChatMessage::new(
            if user { "user" } else { "assistant" },
            text,
        ));
    }
    if messages.len() % 2 == 1 {
        messages.push(ChatMessage::new("assistant", "Noted."));
    }
    messages
}

/// The messages a session starts with (filler, then the task message) and its task.
pub fn initial_conversation(workload: &Workload, session_index: u32) -> (Task, Vec<ChatMessage>) {
    let task = Task::generate(workload, session_index);
    let mut messages: Vec<ChatMessage> = workload
        .request
        .system
        .iter()
        .map(|text| ChatMessage::new("system", text.clone()))
        .collect();
    messages.extend(workload.request.examples.iter().cloned());
    messages.extend(filler(workload, session_index));
    messages.push(ChatMessage::new(
        "user",
        task.render_message(&workload.task),
    ));
    (task, messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::sample_workload;
    use serde_json::json;

    fn read_file_tool(paths: Vec<Value>) -> ToolSpec {
        ToolSpec {
            name: "read_file".into(),
            description: "Read a file".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "max_lines": {"type": "integer"}
                },
                "required": ["path"]
            }),
            arg_values: [
                ("path".to_string(), paths),
                ("max_lines".to_string(), vec![json!(40)]),
            ]
            .into_iter()
            .collect(),
            result: "{path}: ok".into(),
        }
    }

    #[test]
    fn renders_exactly_like_the_design_example() {
        let mut workload = sample_workload(1, 4);
        workload.tools = vec![read_file_tool(vec![json!("/srv/app/config.yaml")])];
        workload.task.steps = 1;
        workload.task.intro = "Do these steps in order, one tool call per step:".into();
        workload.task.outro = "When all steps are done, answer DONE.".into();
        let task = Task::generate(&workload, 0);
        assert_eq!(
            task.render_message(&workload.task),
            "Do these steps in order, one tool call per step:\n\n\
             1. read_file(path=\"/srv/app/config.yaml\", max_lines=40)\n\n\
             When all steps are done, answer DONE."
        );
    }

    #[test]
    fn strings_with_quotes_and_backslashes_are_json_escaped_and_parse_back() {
        let mut workload = sample_workload(1, 4);
        let nasty = "/srv/a \"quoted\" dir\\x, y=1).txt";
        workload.tools = vec![read_file_tool(vec![json!(nasty)])];
        workload.task.steps = 2;
        let task = Task::generate(&workload, 3);
        let text = task.render_message(&workload.task);
        assert!(text
            .contains(r#"1. read_file(path="/srv/a \"quoted\" dir\\x, y=1).txt", max_lines=40)"#));
        let parsed = parse_task_message(&text).expect("list parses");
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].0, "read_file");
        assert_eq!(parsed[0].1["path"], json!(nasty));
        assert_eq!(parsed[0].1["max_lines"], json!(40));
    }

    #[test]
    fn tasks_are_deterministic_per_seed_and_index() {
        let workload = sample_workload(10, 6);
        let a: Vec<Task> = (0..10).map(|i| Task::generate(&workload, i)).collect();
        let b: Vec<Task> = (0..10).map(|i| Task::generate(&workload, i)).collect();
        assert_eq!(a, b);
        let distinct: std::collections::BTreeSet<String> =
            a.iter().map(|t| t.render_message(&workload.task)).collect();
        assert!(distinct.len() >= 9, "sessions should get their own tasks");
        let mut other_seed = workload.clone();
        other_seed.seed += 1;
        assert_ne!(Task::generate(&other_seed, 0), a[0]);
        for task in &a {
            assert_eq!(task.steps.len(), workload.task.steps as usize);
        }
    }

    #[test]
    fn every_pooled_property_is_drawn_in_schema_order() {
        let workload = sample_workload(20, 6);
        for index in 0..20 {
            for step in Task::generate(&workload, index).steps {
                let tool = workload.tools.iter().find(|t| t.name == step.tool).unwrap();
                let names: Vec<&String> = step.args.keys().collect();
                assert_eq!(names, argument_order(tool).iter().collect::<Vec<_>>());
                assert_eq!(step.args.len(), tool.arg_values.len());
                for (name, value) in &step.args {
                    assert!(tool.arg_values[name].contains(value));
                }
            }
        }
        let read = workload
            .tools
            .iter()
            .find(|t| t.name == "read_file")
            .unwrap();
        assert_eq!(argument_order(read), vec!["path", "max_lines"]);
    }

    #[test]
    fn rendered_list_parses_back_to_the_task() {
        let workload = sample_workload(5, 6);
        for index in 0..5 {
            let task = Task::generate(&workload, index);
            let parsed = parse_task_message(&task.render_message(&workload.task)).unwrap();
            let expected: Vec<(String, Map<String, Value>)> = task
                .steps
                .iter()
                .map(|s| (s.tool.clone(), s.args.clone()))
                .collect();
            assert_eq!(parsed, expected);
        }
        assert!(parse_task_message("no list here\n1.5 is a number").is_none());
    }

    #[test]
    fn approx_tokens_counts_words_and_punctuation() {
        assert_eq!(approx_tokens(""), 0);
        assert_eq!(approx_tokens("hello world"), 2);
        assert_eq!(approx_tokens("read_file(path=\"/a/b\")"), 11);
    }

    #[test]
    fn filler_hits_the_token_budget_and_alternates_roles() {
        for ctx in [0u32, 7, 50, 1000, 8000] {
            let mut workload = sample_workload(3, 4);
            workload.ctx = ctx;
            let messages = filler(&workload, 1);
            let total: usize = messages
                .iter()
                .map(|m| approx_tokens(m.content.as_deref().unwrap_or("")))
                .sum();
            if ctx == 0 {
                assert!(messages.is_empty());
                continue;
            }
            assert!(total >= ctx as usize, "ctx {ctx}: only {total} tokens");
            assert!(
                total <= ctx as usize + 200,
                "ctx {ctx}: {total} tokens overshoots"
            );
            assert_eq!(messages.len() % 2, 0);
            for (i, m) in messages.iter().enumerate() {
                assert_eq!(m.role, if i % 2 == 0 { "user" } else { "assistant" });
            }
            assert_eq!(messages, filler(&workload, 1), "deterministic");
            assert_ne!(messages, filler(&workload, 2), "per session");
        }
    }

    #[test]
    fn long_filler_holds_lookalike_calls_and_paths() {
        let mut workload = sample_workload(1, 4);
        workload.ctx = 6000;
        let text: String = filler(&workload, 0)
            .iter()
            .filter_map(|m| m.content.clone())
            .collect::<Vec<_>>()
            .join("\n");
        let names: Vec<&str> = workload.tools.iter().map(|t| t.name.as_str()).collect();
        assert!(names.iter().any(|n| text.contains(&format!("{n}("))));
        let pooled_path = workload.tools[0].arg_values["path"][0]
            .as_str()
            .unwrap()
            .to_string();
        let any_pool_string = workload
            .tools
            .iter()
            .flat_map(|t| t.arg_values.values().flatten())
            .filter_map(Value::as_str)
            .any(|s| text.contains(s));
        assert!(
            any_pool_string,
            "expected a pool value such as {pooled_path}"
        );
        assert!(
            parse_task_message(&text).is_none(),
            "filler must not hold a numbered task list"
        );
    }

    #[test]
    fn initial_conversation_ends_with_the_task_message() {
        let mut workload = sample_workload(1, 4);
        workload.ctx = 200;
        let (task, messages) = initial_conversation(&workload, 0);
        let last = messages.last().unwrap();
        assert_eq!(last.role, "user");
        assert_eq!(
            last.content.as_deref().unwrap(),
            task.render_message(&workload.task)
        );
        assert_eq!(task.expected(0).unwrap().tool, task.steps[0].tool);
        assert!(task.expected(task.steps.len()).is_none());
    }
}
