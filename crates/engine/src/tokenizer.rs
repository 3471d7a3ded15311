//! Tokenizer of the embedded engine: a regex splits text into special tokens (chat
//! template and DSML markers), words, numbers, single punctuation characters and
//! whitespace runs; a shared interned vocabulary maps each token string to a u32 id.
//!
//! Ids are a hash of the token string (linear probing on the rare collision), so the
//! prefill and decode processes, and successive runs, agree on ids without exchanging
//! a vocabulary: prefill's prefix cache is keyed by ids and must never match a prompt
//! that decode tokenized differently.

use parking_lot::RwLock;
use regex::Regex;
use std::collections::HashMap;
use std::sync::OnceLock;

pub(crate) const BOS: &str = "<｜begin▁of▁sentence｜>";
pub(crate) const EOS: &str = "<｜end▁of▁sentence｜>";
pub(crate) const USER: &str = "<｜User｜>";
pub(crate) const ASSISTANT: &str = "<｜Assistant｜>";
pub(crate) const TOOL_OUTPUT_BEGIN: &str = "<｜tool▁output▁begin｜>";
pub(crate) const TOOL_OUTPUT_END: &str = "<｜tool▁output▁end｜>";
pub(crate) const DSML_OPEN: &str = "<｜DSML｜";
pub(crate) const DSML_CLOSE: &str = "</｜DSML｜";

/// Special tokens, matched before anything else (closing DSML first: it contains `<`).
pub(crate) const SPECIALS: [&str; 8] = [
    BOS,
    EOS,
    USER,
    ASSISTANT,
    TOOL_OUTPUT_BEGIN,
    TOOL_OUTPUT_END,
    DSML_CLOSE,
    DSML_OPEN,
];

fn splitter() -> &'static Regex {
    static SPLITTER: OnceLock<Regex> = OnceLock::new();
    SPLITTER.get_or_init(|| {
        let specials: Vec<String> = SPECIALS.iter().map(|s| regex::escape(s)).collect();
        let pattern = format!(
            r"(?s){}|[\p{{L}}_][\p{{L}}\p{{N}}_]*|\p{{N}}+|\s+|.",
            specials.join("|")
        );
        Regex::new(&pattern).expect("tokenizer regex is valid")
    })
}

/// Split text into token strings (no vocabulary involved).
pub(crate) fn split(text: &str) -> Vec<&str> {
    splitter().find_iter(text).map(|m| m.as_str()).collect()
}

fn fnv1a(text: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in text.bytes() {
        hash ^= byte as u32;
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The interned vocabulary, shared by all requests of a process.
#[derive(Default)]
pub(crate) struct Vocab {
    inner: RwLock<VocabInner>,
}

#[derive(Default)]
struct VocabInner {
    ids: HashMap<String, u32>,
    strings: HashMap<u32, String>,
}

impl Vocab {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The id of `token`, interning it on first sight.
    pub(crate) fn id(&self, token: &str) -> u32 {
        if let Some(id) = self.inner.read().ids.get(token) {
            return *id;
        }
        let mut inner = self.inner.write();
        if let Some(id) = inner.ids.get(token) {
            return *id;
        }
        let mut id = fnv1a(token);
        while inner.strings.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        inner.ids.insert(token.to_string(), id);
        inner.strings.insert(id, token.to_string());
        id
    }

    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        split(text)
            .into_iter()
            .map(|token| self.id(token))
            .collect()
    }

    pub(crate) fn decode(&self, ids: &[u32]) -> String {
        let inner = self.inner.read();
        ids.iter()
            .map(|id| inner.strings.get(id).map(String::as_str).unwrap_or("<unk>"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_specials_words_numbers_punctuation_and_whitespace() {
        let text =
            "<｜DSML｜parameter name=\"max_lines\" string=\"false\">40</｜DSML｜parameter>\n\n";
        assert_eq!(
            split(text),
            vec![
                "<｜DSML｜",
                "parameter",
                " ",
                "name",
                "=",
                "\"",
                "max_lines",
                "\"",
                " ",
                "string",
                "=",
                "\"",
                "false",
                "\"",
                ">",
                "40",
                "</｜DSML｜",
                "parameter",
                ">",
                "\n\n"
            ]
        );
        assert_eq!(
            split("/srv/app/config.yaml"),
            vec!["/", "srv", "/", "app", "/", "config", ".", "yaml"]
        );
    }

    #[test]
    fn round_trips_and_ids_are_stable_across_vocabularies() {
        let a = Vocab::new();
        let b = Vocab::new();
        let text = "<｜User｜>read_file(path=\"/srv/x\")<｜Assistant｜>";
        let ids = a.encode(text);
        b.encode("something else first");
        assert_eq!(b.encode(text), ids);
        assert_eq!(a.decode(&ids), text);
    }
}
