//! A verdict's reasons, typed: each says why the status is what it is (a finding), gives
//! a figure for reference only, or warns of something that does not change the status.
//! run.json keeps each as the one line of text its readers have always read (a
//! warning's with `warning: ` in front): the kind is decided where the reason is made,
//! and read back from that line only when an older record is loaded.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a reason is to the verdict's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReasonKind {
    /// Why the status is what it is; an inconclusive summary lists every one.
    Finding,
    /// A figure given for reference only (the adaptive run's pooled Fisher p, not valid
    /// under optional stopping); never a cause of the status.
    Reference,
    /// Recorded and worth a look, but it does not change the status.
    Warning,
}

/// One reason, as its kind and the line it is written as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    kind: ReasonKind,
    line: String,
}

/// How a warning's line starts in run.json and every report.
const WARNING: &str = "warning: ";
/// How a reference figure's line starts (the words are part of the figure's text).
const REFERENCE: &str = "for reference";

impl Reason {
    pub fn finding(text: impl Into<String>) -> Reason {
        Reason {
            kind: ReasonKind::Finding,
            line: text.into(),
        }
    }

    /// `text` must say it is for reference only: the line is written as it is.
    pub fn reference(text: impl Into<String>) -> Reason {
        Reason {
            kind: ReasonKind::Reference,
            line: text.into(),
        }
    }

    pub fn warning(note: &str) -> Reason {
        Reason {
            kind: ReasonKind::Warning,
            line: format!("{WARNING}{note}"),
        }
    }

    #[cfg(test)]
    pub(crate) fn kind(&self) -> ReasonKind {
        self.kind
    }

    pub(crate) fn is_finding(&self) -> bool {
        self.kind == ReasonKind::Finding
    }

    /// The line as run.json and the reports write it.
    pub fn as_str(&self) -> &str {
        &self.line
    }

    /// The kind of a line read from a record: records keep the line only.
    fn read(line: String) -> Reason {
        let kind = if line.starts_with(WARNING) {
            ReasonKind::Warning
        } else if line.starts_with(REFERENCE) {
            ReasonKind::Reference
        } else {
            ReasonKind::Finding
        };
        Reason { kind, line }
    }
}

/// The findings among `reasons`, in order, as one line: why an inconclusive verdict is
/// inconclusive, without its warnings or reference figures.
pub fn findings(reasons: &[Reason]) -> String {
    let shown: Vec<&str> = reasons
        .iter()
        .filter(|r| r.is_finding())
        .map(Reason::as_str)
        .collect();
    shown.join("; ")
}

/// A reason reads as its line, so reports and tests treat it as the text it is.
impl Deref for Reason {
    type Target = str;
    fn deref(&self) -> &str {
        &self.line
    }
}

impl Borrow<str> for Reason {
    fn borrow(&self) -> &str {
        &self.line
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        &self.line
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.line)
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Reason, D::Error> {
        String::deserialize(d).map(Reason::read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_written_as_its_line_and_read_back_as_that_kind() {
        let reasons = [
            Reason::finding("Fisher p = 0.001 < alpha 0.05: on (=1) corrupts more"),
            Reason::reference("for reference only: pooled Fisher p = 0.2"),
            Reason::warning("replies truncated at max_tokens"),
        ];
        let json = serde_json::to_string(&reasons).unwrap();
        assert_eq!(
            json,
            r#"["Fisher p = 0.001 < alpha 0.05: on (=1) corrupts more","for reference only: pooled Fisher p = 0.2","warning: replies truncated at max_tokens"]"#
        );
        let back: Vec<Reason> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, reasons);
        assert_eq!(
            back.iter().map(Reason::kind).collect::<Vec<_>>(),
            [
                ReasonKind::Finding,
                ReasonKind::Reference,
                ReasonKind::Warning
            ]
        );
        assert_eq!(back.join("; ").matches("; ").count(), 2);
    }
}
