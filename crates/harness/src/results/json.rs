//! Every record's JSON file (`run.json`, `load.json`, `culprit.json`, `commits.json`,
//! `matrix.json`, `diff.json`): the record itself, pretty-printed, ending in a newline.
//! Field names are a contract other tools read: extend, never rename.

use serde::Serialize;

use super::Exporter;

/// The JSON exporter of any record, writing the file it names.
pub(crate) struct JsonFile(pub(crate) &'static str);

impl<R: Serialize + ?Sized> Exporter<R> for JsonFile {
    fn file_name(&self) -> &'static str {
        self.0
    }
    fn render(&self, record: &R) -> anyhow::Result<String> {
        let mut text = serde_json::to_string_pretty(record)?;
        text.push('\n');
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_pretty_printed_and_ends_in_a_newline() {
        let text = JsonFile("x.json")
            .render(&serde_json::json!({"a": [1]}))
            .unwrap();
        assert_eq!(text, "{\n  \"a\": [\n    1\n  ]\n}\n");
    }
}
