//! Secrets never reach what bisect writes: the API key's value is replaced by `***` in
//! transcripts (sessions.jsonl), run.json, summary.md, report.html and the error
//! messages bisect prints (docs/design.md 3.2, `api_key_env`).
//!
//! A process-wide registry, because the key travels from the command line's target
//! resolution to every writer (results files, error printing in `main`), and a server
//! may echo it anywhere in an error body. Writers call [`scrub`] on the text they are
//! about to write; the HTTP client also scrubs its own key out of error excerpts at the
//! source. Values shorter than [`MIN_SECRET_LEN`] are not registered: replacing every
//! occurrence of a 2-character "key" would mangle the results, and such a key is not a
//! secret worth the name.

use std::borrow::Cow;
use std::sync::RwLock;

/// The mask a secret is replaced with.
pub(crate) const MASK: &str = "***";

/// Shorter values are not treated as secrets (see the module doc).
pub(crate) const MIN_SECRET_LEN: usize = 4;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Registers a secret to mask in everything written from now on (idempotent).
pub fn register(secret: &str) {
    if secret.len() < MIN_SECRET_LEN {
        return;
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    if !secrets.iter().any(|s| s == secret) {
        secrets.push(secret.to_string());
        // Longest first, so a secret that contains another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every registered secret replaced by [`MASK`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    mask(text, &secrets)
}

/// `text` with each of `secrets` (longest first) replaced by [`MASK`].
pub fn mask<'a>(text: &'a str, secrets: &[String]) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for secret in secrets.iter().filter(|s| s.len() >= MIN_SECRET_LEN) {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), MASK));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_whole_and_short_values_are_not_secrets() {
        let secrets = vec!["sk-live-abcdef".to_string(), "abc".to_string()];
        assert_eq!(
            mask("bad key sk-live-abcdef (sk-live-abcdef)", &secrets),
            "bad key *** (***)"
        );
        assert_eq!(mask("abc stays", &secrets), "abc stays");
        assert!(matches!(mask("nothing here", &secrets), Cow::Borrowed(_)));
    }

    #[test]
    fn registered_secrets_are_scrubbed_everywhere() {
        register("sk-registered-7f3a9");
        register("sk-registered-7f3a9");
        register("ab");
        assert_eq!(scrub("key=sk-registered-7f3a9;"), "key=***;");
        assert_eq!(scrub("ab"), "ab");
    }
}
