//! What `bisect commits` searches over, and which way: a git repository's first-parent
//! range between two commits, or an ordered list of releases (`--releases
//! 0.3.7,0.3.8,0.3.9`, oldest first, each made runnable by `--artifact`'s command over
//! `{release}`); and whether it looks for the first commit where the corruption appears
//! (`--find break`, git bisect's default) or the first where it is gone (`--find fix`,
//! mozregression's find-fix; git bisect's old/new terms).
//!
//! The search ([`crate::core::commits`]) only knows "the first bad commit after a good
//! end". A fix search is the same search over the list reversed: newest first, so the
//! fixed end is its good end and the oldest (broken) end its bad end. Its culprit is then
//! the last release that still shows the bug, and the culprit's parent in that order is
//! the first release without it; the verification A/B (culprit on, parent off) is the
//! same claim read backwards: the release before the fix corrupts more than the fix.
//! Only the words change, at the edge ([`super::record`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::git::{first_parent_range, CommitInfo};
use crate::exit::Failure;

/// The list the search runs over, in time order.
#[derive(Debug, Clone, PartialEq)]
pub enum RangeSpec {
    /// GOOD's first-parent descendants up to BAD (with `--find fix`: the older, broken
    /// end and the newer, fixed one).
    Git {
        repo: PathBuf,
        good: String,
        bad: String,
    },
    /// Release names, oldest first; `{release}` (and `{commit}`) in the artifact command
    /// and restart commands stand for one of them.
    Releases(Vec<String>),
}

/// Which change the search looks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Find {
    /// The first commit (release) that corrupts, after one that does not.
    #[default]
    Break,
    /// The first commit (release) that no longer corrupts, after one that does.
    Fix,
}

impl Find {
    /// For `skip_serializing_if`: records of break searches keep their old shape.
    pub(crate) fn is_break(&self) -> bool {
        *self == Find::Break
    }
}

impl RangeSpec {
    /// The repository, for a git range.
    pub fn repo(&self) -> Option<&Path> {
        match self {
            RangeSpec::Git { repo, .. } => Some(repo),
            RangeSpec::Releases(_) => None,
        }
    }

    /// What the record says the search ran over.
    pub fn words(&self) -> String {
        match self {
            RangeSpec::Git { repo, .. } => repo.display().to_string(),
            RangeSpec::Releases(names) => format!("releases {}", names.join(",")),
        }
    }

    /// The list in the search's order, index 0 its good end: time order for a break
    /// search, newest first for a fix search.
    pub fn list(&self, find: Find) -> anyhow::Result<Vec<CommitInfo>> {
        let mut list = match self {
            RangeSpec::Git { repo, good, bad } => first_parent_range(repo, good, bad)?,
            RangeSpec::Releases(names) => names
                .iter()
                .enumerate()
                .map(|(index, name)| CommitInfo {
                    index,
                    sha: name.clone(),
                    subject: format!("release {name}"),
                })
                .collect(),
        };
        if find == Find::Fix {
            list.reverse();
            for (index, c) in list.iter_mut().enumerate() {
                c.index = index;
            }
        }
        Ok(list)
    }
}

/// `--releases` as given: at least two names, none twice, each a plain word that a
/// command line can carry unquoted (`{release}` is pasted into `sh -c`).
pub fn parse_releases(names: &[String]) -> Result<Vec<String>, Failure> {
    let bad = |what: String| {
        Failure::bad_input(
            format!("--releases {}: {what}", names.join(",")),
            "list two or more release names, oldest first, separated by commas (e.g. --releases 0.3.7,0.3.8,0.3.9)",
        )
    };
    if names.len() < 2 {
        return Err(bad("a search needs two releases or more".into()));
    }
    for (i, name) in names.iter().enumerate() {
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'));
        if !plain {
            return Err(bad(format!(
                "release {} ({name:?}) is not a plain name: only letters, digits and . - _ + \
                 (it is pasted into the artifact's shell command)",
                i + 1
            )));
        }
        if names[..i].contains(name) {
            return Err(bad(format!("release {name} is listed twice")));
        }
    }
    Ok(names.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_fix_search_runs_over_the_releases_newest_first() {
        let releases = RangeSpec::Releases(names(&["0.3.7", "0.3.8", "0.3.9"]));
        let order = |find| -> Vec<(usize, String)> {
            releases
                .list(find)
                .unwrap()
                .into_iter()
                .map(|c| (c.index, c.sha))
                .collect()
        };
        assert_eq!(
            order(Find::Break),
            [
                (0, "0.3.7".into()),
                (1, "0.3.8".into()),
                (2, "0.3.9".into())
            ]
        );
        // The fixed end is the search's good end; the oldest, broken one its bad end.
        assert_eq!(
            order(Find::Fix),
            [
                (0, "0.3.9".into()),
                (1, "0.3.8".into()),
                (2, "0.3.7".into())
            ]
        );
        assert_eq!(releases.repo(), None);
        assert_eq!(releases.words(), "releases 0.3.7,0.3.8,0.3.9");
        assert_eq!(
            releases.list(Find::Fix).unwrap()[0].subject,
            "release 0.3.9"
        );
    }

    #[test]
    fn release_names_that_a_shell_would_split_or_that_repeat_are_refused() {
        assert_eq!(
            parse_releases(&names(&["b4940", "b4941+cpu", "v1.0_rc-2"])).unwrap(),
            names(&["b4940", "b4941+cpu", "v1.0_rc-2"])
        );
        let refused = |list: &[&str]| parse_releases(&names(list)).unwrap_err().to_string();
        assert!(refused(&["0.3.8"]).contains("two releases or more"));
        let spaced = refused(&["0.3.8", "0.3.9; rm -rf ~"]);
        assert!(spaced.contains("release 2") && spaced.contains("not a plain name"));
        assert!(spaced.contains("fix: list two or more release names, oldest first"));
        assert!(refused(&["0.3.8", ""]).contains("release 2"));
        assert!(refused(&["0.3.8", "0.3.9", "0.3.8"]).contains("0.3.8 is listed twice"));
    }
}
