//! Engine rejections (docs/design.md 3.5, `rejected`): a serving engine that cannot parse
//! the tool-call markup its model wrote may refuse the whole reply with an HTTP error
//! instead of returning the text. Such a reply is the corruption bisect hunts, caught
//! by the engine before it reached the client; counted as an infrastructure error it
//! would leave the judged denominator and make the flag that corrupts calls look
//! cleaner. A [`RejectionPattern`] names one such reply: its status (any non-2xx when
//! unset) and a regular expression its body must match. Engine presets supply the
//! engines' own wordings (`config/engine.rs`); a target profile adds or replaces them
//! (`[[reject]]`, docs/design.md 3.2).
//!
//! Compiled once per run ([`RejectionSet::new`]); matching is a pure function of the
//! status and the body.

use regex::Regex;
use serde::{Deserialize, Serialize};

/// One way an engine says "the model's tool call did not parse".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionPattern {
    /// Short tag shown in the evidence (`rejected[llamacpp.format]: ...`).
    pub name: String,
    /// The HTTP status it comes with; `None` matches any non-2xx status (an engine whose
    /// status for it changed between versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Regular expression (Rust `regex` syntax) searched for in the body.
    pub body: String,
}

impl RejectionPattern {
    pub fn new(name: &str, status: Option<u16>, body: &str) -> Self {
        RejectionPattern {
            name: name.to_string(),
            status,
            body: body.to_string(),
        }
    }
}

/// Why a pattern cannot be used: the loader of a target profile turns it into a
/// configuration error at the pattern's line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRejection {
    #[error("rejection pattern `{name}`: body {body:?} is not a regular expression: {reason}")]
    Regex {
        name: String,
        body: String,
        reason: String,
    },
    #[error("rejection pattern `{name}`: body is empty, so it would match every error reply")]
    EmptyBody { name: String },
    #[error("rejection pattern `{name}`: status {status} is not an error status (400-599)")]
    Status { name: String, status: u16 },
}

/// The patterns of a run, compiled.
#[derive(Debug, Clone, Default)]
pub struct RejectionSet {
    patterns: Vec<(RejectionPattern, Regex)>,
}

impl RejectionSet {
    /// Compiles `patterns`; the first that cannot be used is the error.
    pub fn new(patterns: &[RejectionPattern]) -> Result<Self, BadRejection> {
        let mut compiled = Vec::with_capacity(patterns.len());
        for p in patterns {
            check(p)?;
            let regex = Regex::new(&p.body).map_err(|e| BadRejection::Regex {
                name: p.name.clone(),
                body: p.body.clone(),
                // The regex crate's message spans lines (a caret under the pattern);
                // the last line says what is wrong.
                reason: e
                    .to_string()
                    .lines()
                    .rfind(|l| !l.trim().is_empty())
                    .unwrap_or("invalid")
                    .trim()
                    .to_string(),
            })?;
            compiled.push((p.clone(), regex));
        }
        Ok(RejectionSet { patterns: compiled })
    }

    /// The first pattern a reply with `status` and `body` matches.
    pub fn find(&self, status: u16, body: &str) -> Option<&RejectionPattern> {
        if (200..300).contains(&status) {
            return None;
        }
        self.patterns
            .iter()
            .find(|(p, re)| (p.status.is_none() || p.status == Some(status)) && re.is_match(body))
            .map(|(p, _)| p)
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }
}

/// A pattern's own checks, before its regex is compiled.
pub fn check(p: &RejectionPattern) -> Result<(), BadRejection> {
    if p.body.trim().is_empty() {
        return Err(BadRejection::EmptyBody {
            name: p.name.clone(),
        });
    }
    if let Some(status) = p.status {
        if !(400..=599).contains(&status) {
            return Err(BadRejection::Status {
                name: p.name.clone(),
                status,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_its_status_and_body_only() {
        let set = RejectionSet::new(&[
            RejectionPattern::new(
                "format",
                Some(500),
                "does not match the expected \\S+ format",
            ),
            RejectionPattern::new(
                "any",
                None,
                "validation errors? for list\\[FunctionDefinition\\]",
            ),
        ])
        .unwrap();
        let body = r#"{"error":{"code":500,"message":"The model produced output that does not match the expected Hermes 2 Pro format","type":"server_error"}}"#;
        assert_eq!(
            set.find(500, body).map(|p| p.name.as_str()),
            None,
            "two words"
        );
        let body = body.replace("Hermes 2 Pro", "Hermes");
        assert_eq!(set.find(500, &body).unwrap().name, "format");
        assert!(set.find(400, &body).is_none(), "another status");
        assert!(
            set.find(200, &body).is_none(),
            "a 2xx is a reply, never a rejection"
        );
        let pydantic = "1 validation error for list[FunctionDefinition]\n  Invalid JSON";
        assert_eq!(set.find(400, pydantic).unwrap().name, "any");
        assert_eq!(set.find(500, pydantic).unwrap().name, "any");
        assert!(set.find(503, "server overloaded").is_none());
    }

    #[test]
    fn unusable_patterns_say_why() {
        let bad =
            RejectionSet::new(&[RejectionPattern::new("x", Some(500), "(unclosed")]).unwrap_err();
        assert!(
            matches!(&bad, BadRejection::Regex { reason, .. } if reason.contains("unclosed")),
            "{bad}"
        );
        let empty = RejectionSet::new(&[RejectionPattern::new("x", None, "  ")]).unwrap_err();
        assert!(matches!(empty, BadRejection::EmptyBody { .. }));
        let ok_status = RejectionSet::new(&[RejectionPattern::new("x", Some(200), "a")]);
        assert!(matches!(
            ok_status.unwrap_err(),
            BadRejection::Status { status: 200, .. }
        ));
    }
}
