//! report.html of `bisect commits`: self-contained (inline CSS and SVG, no script). The
//! answer in words, the posterior over the range after each step as a heat map (a row per
//! step, a column per commit, the last column "no single culprit"; darker is more
//! probable; the tested commit of each step outlined), and the table of steps.

use super::record::{
    answer_line, observation_words, posterior_history, range_words, setup_lines, step_labels,
    CommitsRecord,
};
use crate::results::markup::{escape, page};

const CELL_H: f64 = 10.0;
const WIDTH: f64 = 900.0;

/// The page.
pub(super) fn render_html(r: &CommitsRecord) -> String {
    let mut s = String::new();
    s += &format!("<h1>bisect commits {}</h1>", escape(&r.header.id));
    s += &format!("<p><code>{}</code></p>", escape(&r.header.command));
    s += &format!(
        "<p><b>{}</b>: {}</p>",
        escape(r.answer.map_or("running", |a| a.name())),
        escape(r.verdict.as_deref().unwrap_or("-"))
    );
    for line in setup_lines(r) {
        s += &format!("<p>{}</p>", escape(&line));
    }
    s += &format!("<p>{}.</p>", escape(&range_words(r)));
    if let Some(line) = answer_line(r) {
        s += &format!("<p>{}</p>", escape(&line));
    }
    s += &format!(
        "<p>{} commits, {} steps, {} sessions, {} builds ({:.0} s).</p>",
        r.commits.len(),
        r.steps.len(),
        r.sessions_spent,
        r.builds_run,
        r.build_s
    );
    s += "<h2>Posterior after each step</h2>";
    s += &heat_map(r);
    s += "<h2>Steps</h2><table><tr><th>step</th><th>commit</th><th>purpose</th><th>result</th><th>block</th></tr>";
    for (st, (label, _)) in r.steps.iter().zip(step_labels(r)) {
        let links: Vec<String> = st
            .dirs()
            .iter()
            .map(|d| format!("<a href=\"{0}/sessions.jsonl\">{0}/</a>", escape(d)))
            .collect();
        let dir = if links.is_empty() {
            "-".to_string()
        } else {
            links.join(" ")
        };
        s +=
            &format!(
            "<tr><td>{}</td><td>{} <code>{}</code> {}</td><td>{:?}</td><td>{}</td><td>{}</td></tr>",
            escape(&label),
            st.commit,
            escape(super::git::short_id(&st.sha)),
            escape(&r.commits.get(st.commit).map_or(String::new(), |c| c.subject.clone())),
            st.purpose,
            escape(&observation_words(&st.observation)),
            dir
        );
    }
    s += "</table>\n";
    page(&format!("bisect commits {}", r.header.id), &s)
}

fn heat_map(r: &CommitsRecord) -> String {
    let rows = posterior_history(r);
    let columns = r.commits.len().max(1) + 1;
    let w = WIDTH / columns as f64;
    let height = CELL_H * rows.len().max(1) as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" role=\"img\" \
         aria-label=\"posterior of the first bad commit after each step\">"
    );
    for (y, row) in rows.iter().enumerate() {
        for (x, p) in row.iter().enumerate() {
            if *p < 1e-3 {
                continue;
            }
            s += &format!(
                "<rect x=\"{:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{CELL_H}\" fill=\"#b30000\" fill-opacity=\"{:.3}\"/>",
                x as f64 * w,
                y as f64 * CELL_H,
                w.max(0.5),
                p.sqrt()
            );
        }
        let tested = r.steps[y].commit;
        s += &format!(
            "<rect x=\"{:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{CELL_H}\" fill=\"none\" stroke=\"#000\" stroke-width=\"0.8\"/>",
            tested as f64 * w,
            y as f64 * CELL_H,
            w.max(0.5)
        );
    }
    s += "</svg>";
    s
}
