//! The building blocks every record kind's renderings share (hyperfine's `markup.rs`
//! idea): HTML escaping, the self-contained page with its style, the verdict box, fact
//! lists and figures, and the markdown table header. Run, matrix, culprit, diff and
//! check pages are made of these, so they look alike and escape alike.

use std::fmt::Write as _;

/// Escape text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// XML attribute and text escaping for the JUnit files; control characters other than
/// tab and newline are dropped because XML 1.0 cannot carry them at all.
pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' => out.push(ch),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

/// Counts of a JUnit file's one suite.
pub(crate) struct JunitCounts {
    pub tests: usize,
    pub failures: usize,
    pub errors: usize,
    pub skipped: usize,
    /// Seconds, when the suite measured them.
    pub time: Option<f64>,
}

/// The XML declaration, `<testsuites>` and the one `<testsuite>` opening, both named
/// `suite` with the same counts (`timestamp` on the suite).
pub(crate) fn junit_open(suite: &str, c: &JunitCounts, timestamp: &str) -> String {
    let time = c
        .time
        .map_or(String::new(), |t| format!(" time=\"{t:.3}\""));
    let counts = format!(
        "tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\"{time}",
        c.tests, c.failures, c.errors, c.skipped
    );
    let name = xml_escape(suite);
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"{name}\" {counts}>\n  <testsuite name=\"{name}\" {counts} timestamp=\"{}\">\n",
        xml_escape(timestamp)
    )
}

/// A JUnit `<properties>` block of `(name, value)` pairs, indented for a test suite.
pub(crate) fn junit_properties(props: &[(&str, String)]) -> String {
    let mut x = String::from("    <properties>\n");
    for (k, v) in props {
        x.push_str(&format!(
            "      <property name=\"{k}\" value=\"{}\"/>\n",
            xml_escape(v)
        ));
    }
    x.push_str("    </properties>\n");
    x
}

/// A coloured box: `class` is a verdict status (`implicated`, `cleared`,
/// `inconclusive`); `inner` is HTML already escaped.
pub(crate) fn verdict_box(class: &str, heading: &str, inner: &str) -> String {
    format!(
        "<section class=\"verdict {}\"><h2>{}</h2>{inner}</section>\n",
        escape(class),
        escape(heading)
    )
}

pub(crate) fn facts_list(items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    format!(
        "<ul class=\"facts\"><li>{}</li></ul>\n",
        items.join("</li><li>")
    )
}

pub fn list<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let mut s = String::from("<ul>");
    for i in items {
        let _ = write!(s, "<li>{}</li>", escape(i.as_ref()));
    }
    s.push_str("</ul>");
    s
}

pub fn figure(svg: anyhow::Result<String>) -> String {
    match svg {
        Ok(svg) => format!("<figure>{}</figure>\n", strip_xml_declaration(&svg)),
        Err(e) => format!(
            "<p class=\"error\">chart not drawn: {}</p>\n",
            escape(&format!("{e:#}"))
        ),
    }
}

fn strip_xml_declaration(svg: &str) -> &str {
    match svg.strip_prefix("<?xml") {
        Some(rest) => rest
            .find("?>")
            .map(|i| rest[i + 2..].trim_start())
            .unwrap_or(svg),
        None => svg,
    }
}

pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}<footer><p class=\"meta\">Written by bisect {}; self-contained: no scripts, no network.</p></footer>\n</body>\n</html>\n",
        escape(title),
        env!("CARGO_PKG_VERSION"),
    )
}

const STYLE: &str = r#"
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1180px; padding: 0 16px; color: #1d1d1f; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.2em; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: #555; margin-top: 0; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12.5px; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f8fa; padding: 6px 8px; border-radius: 4px; margin: 4px 0; }
table { border-collapse: collapse; margin: 10px 0; font-size: 13.5px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f3f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.blocking td { background: #ffe3e3; } tr.warning td { background: #fff5d6; }
.verdict { border-left: 6px solid #999; padding: 8px 16px; background: #f7f7f7; border-radius: 4px; }
.verdict h2 { border: none; margin-top: 4px; }
.verdict.implicated { border-color: #d1242f; background: #fff0f0; }
.verdict.cleared { border-color: #1a7f37; background: #effaf1; }
.verdict.inconclusive { border-color: #bf8700; background: #fff8e1; }
figure { margin: 8px 0; } figure svg { max-width: 100%; height: auto; border: 1px solid #eee; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 8px; }
details.session { border: 1px solid #d0d7de; border-radius: 4px; margin: 6px 0; padding: 4px 10px; }
details.session.corrupted { border-left: 4px solid #d1242f; } details.session.failed { border-left: 4px solid #bf8700; }
details summary { cursor: pointer; }
.msg { border-top: 1px dashed #ddd; padding: 4px 0; } .msg.assistant > b { color: #0550ae; } .msg.tool > b { color: #1a7f37; }
.reasoning { color: #666; } .call { background: #eef6ff; } .error { color: #d1242f; }
.facts code { word-break: break-all; }
"#;

/// The header row and rule of a Markdown table (`| a | b |`, then `|---|---|`): every
/// summary.md table starts with it.
pub(crate) fn table_header<S: AsRef<str>>(columns: &[S]) -> String {
    let names: Vec<&str> = columns.iter().map(AsRef::as_ref).collect();
    format!(
        "| {} |\n|{}\n",
        names.join(" | "),
        "---|".repeat(names.len())
    )
}
