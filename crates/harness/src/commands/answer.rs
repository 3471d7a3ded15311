//! The answer a search's record gives (`bisect commits`, `bisect culprit`), as one enum
//! with its words and its exit code: a record says it under `answer` by name, and
//! nothing reads the name back to decide.

use serde::{Deserialize, Serialize};

/// What a culprit or commit search concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchAnswer {
    /// A culprit found (and, for `commits`, verified by its A/B).
    Culprit,
    /// `commits`: a culprit whose verification A/B did not confirm it.
    Unverified,
    /// The ends do not differ: nothing listed is the cause.
    NoCulprit,
    /// The failing end does not reproduce at this load.
    CouldNotReproduce,
    Inconclusive,
}

impl SearchAnswer {
    /// The record's word for it (`culprit`, `no_culprit`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SearchAnswer::Culprit => "culprit",
            SearchAnswer::Unverified => "unverified",
            SearchAnswer::NoCulprit => "no_culprit",
            SearchAnswer::CouldNotReproduce => "could_not_reproduce",
            SearchAnswer::Inconclusive => "inconclusive",
        }
    }

    /// `bisect commits`' exit code: 0 a culprit found and verified, 1 no culprit (or
    /// the bad end does not reproduce), 3 inconclusive or unverified.
    pub fn exit_code(self) -> u8 {
        match self {
            SearchAnswer::Culprit => crate::exit::OK,
            SearchAnswer::NoCulprit | SearchAnswer::CouldNotReproduce => {
                crate::exit::COMMITS_NO_CULPRIT
            }
            SearchAnswer::Unverified | SearchAnswer::Inconclusive => crate::exit::COULD_NOT_RUN,
        }
    }

    /// Whether it clears what was searched (no culprit, or nothing to find).
    pub fn clears(self) -> bool {
        matches!(
            self,
            SearchAnswer::NoCulprit | SearchAnswer::CouldNotReproduce
        )
    }
}

impl std::fmt::Display for SearchAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_records_words_and_exit_codes_the_documented_ones() {
        for (answer, word, code) in [
            (SearchAnswer::Culprit, "culprit", 0),
            (SearchAnswer::Unverified, "unverified", 3),
            (SearchAnswer::NoCulprit, "no_culprit", 1),
            (SearchAnswer::CouldNotReproduce, "could_not_reproduce", 1),
            (SearchAnswer::Inconclusive, "inconclusive", 3),
        ] {
            assert_eq!(answer.name(), word);
            assert_eq!(serde_json::to_value(answer).unwrap(), word);
            assert_eq!(answer.exit_code(), code, "{word}");
        }
    }
}
