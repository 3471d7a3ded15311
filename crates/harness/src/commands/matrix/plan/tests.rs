//! PLAN.toml parsing: cells, hashes and every refusal with its line.

use super::*;
use crate::core::load::Allocation;

fn parse(text: &str) -> Result<Plan, ConfigError> {
    Plan::parse(Path::new("plans/t.toml"), text)
}

fn error_line(text: &str) -> (usize, String) {
    parse(text).unwrap_err().line_and_text()
}

const AXES: &str = "name = \"t\"\nworkload = \"smoke\"\nsessions = [1, 4]\n\n[axes]\nHICACHE = [\"on\", \"off\"]\nBF16_INDEX_K = [1, 0]\n";

#[test]
fn axes_cross_in_file_order_with_sessions_innermost() {
    let plan = parse(AXES).unwrap();
    let ids: Vec<&str> = plan.cells.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "HICACHE=on,BF16_INDEX_K=1,s1",
            "HICACHE=on,BF16_INDEX_K=1,s4",
            "HICACHE=on,BF16_INDEX_K=0,s1",
            "HICACHE=on,BF16_INDEX_K=0,s4",
            "HICACHE=off,BF16_INDEX_K=1,s1",
            "HICACHE=off,BF16_INDEX_K=1,s4",
            "HICACHE=off,BF16_INDEX_K=0,s1",
            "HICACHE=off,BF16_INDEX_K=0,s4",
        ]
    );
    let groups: Vec<usize> = plan.cells.iter().map(|c| c.group).collect();
    assert_eq!(groups, [0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(plan.repeats, 1);
    assert_eq!(plan.policy, RegressionPolicy::default());
    assert!(plan.cells.iter().all(|c| c.rounds == plan.workload.rounds));
}

#[test]
fn plan_hash_follows_content_not_formatting() {
    let a = parse(AXES).unwrap();
    let b = parse(&AXES.replace("sessions = [1, 4]", "sessions = [ 1 , 4 ]  # comment")).unwrap();
    assert_eq!(a.hash(), b.hash());
    let c = parse(&AXES.replace("[1, 4]", "[1, 8]")).unwrap();
    assert_ne!(a.hash(), c.hash());
    let d = parse(&format!("ctx = 7\n{AXES}")).unwrap();
    assert_ne!(a.workload_hash(), d.workload_hash());
    assert_eq!(a.cells[0].config_hash, d.cells[0].config_hash);
}

#[test]
fn unknown_flag_names_its_line() {
    let (line, msg) = error_line(&AXES.replace("BF16_INDEX_K = [1, 0]", "BOGUS = [1, 0]"));
    assert_eq!(line, 7, "{msg}");
    assert!(
        msg.contains("unknown flag `BOGUS`") && msg.contains("BF16_INDEX_K"),
        "{msg}"
    );
}

#[test]
fn switch_values_must_be_its_labels() {
    let (line, msg) = error_line(&AXES.replace("[\"on\", \"off\"]", "[\"on\", \"1\"]"));
    assert_eq!(line, 6, "{msg}");
    assert!(msg.contains("is a switch"), "{msg}");
}

#[test]
fn bad_values_and_keys_are_refused_with_lines() {
    let (line, msg) = error_line(&AXES.replace("[1, 4]", "[1, 0]"));
    assert_eq!(line, 3, "{msg}");
    let (line, msg) = error_line(&AXES.replace("[1, 0]", "[\"a b\", 0]"));
    assert_eq!(line, 7, "{msg}");
    assert!(msg.contains("contains ' '"), "{msg}");
    let (line, msg) = error_line(&format!("alpha = 1.5\n{AXES}"));
    assert_eq!(line, 1, "{msg}");
    let (line, msg) = error_line(&format!("colour = 1\n{AXES}"));
    assert_eq!(line, 1, "{msg}");
    assert!(msg.contains("colour"), "{msg}");
    let (_, msg) = error_line("name = \"t\"\n");
    assert!(msg.contains("neither [axes] nor [[cell]]"), "{msg}");
    let (line, msg) = error_line(&format!("{AXES}\n[set]\nHICACHE = \"on\"\n"));
    assert_eq!(line, 10, "{msg}");
    assert!(msg.contains("both pinned"), "{msg}");
}

#[test]
fn explicit_cells_group_by_flag_values_in_first_appearance_order() {
    let text = "name = \"t\"\nworkload = \"smoke\"\n\
        [[cell]]\nflags = { HICACHE = \"on\" }\nsessions = 4\n\
        [[cell]]\nflags = { HICACHE = \"off\" }\nsessions = 4\n\
        [[cell]]\nflags = { HICACHE = \"on\" }\nsessions = 8\nrounds = 2\n";
    let plan = parse(text).unwrap();
    let ids: Vec<(&str, usize)> = plan
        .cells
        .iter()
        .map(|c| (c.id.as_str(), c.group))
        .collect();
    assert_eq!(
        ids,
        [
            ("HICACHE=on,s4", 0),
            ("HICACHE=on,s8,r2", 0),
            ("HICACHE=off,s4", 1)
        ]
    );
    let mismatched = text.replace(
        "flags = { HICACHE = \"off\" }",
        "flags = { BF16_INDEX_K = \"0\" }",
    );
    let (line, msg) = error_line(&mismatched);
    assert_eq!(line, 7, "{msg}");
    assert!(msg.contains("same flags"), "{msg}");
    let dup = text.replace("sessions = 8\nrounds = 2", "sessions = 4");
    let (line, msg) = error_line(&dup);
    assert_eq!(line, 3, "{msg}");
    assert!(
        msg.contains("same configuration (id HICACHE=on,s4)"),
        "{msg}"
    );
}

#[test]
fn shipped_nightly_plan_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans/nightly.toml");
    let plan = Plan::load(&path).unwrap();
    assert_eq!(plan.name, "nightly");
    assert!(
        plan.target.is_none(),
        "the nightly runs the embedded engine"
    );
    assert_eq!(plan.cells.len(), 12);
    assert_eq!(plan.cells.last().unwrap().group, 3);
    assert_eq!(plan.cells[2].id, "BF16_INDEX_K=1,HICACHE=on,s64");
    assert_eq!(plan.policy.tokens_per_s_noise, 0.5);
}

/// The nightly's axes and a load sweep of BF16_INDEX_K (HICACHE fixed on).
const WITH_LOAD: &str = "name = \"t\"\nworkload = \"smoke\"\nsessions = [1, 4]\n\n\
    [axes]\nHICACHE = [\"on\", \"off\"]\nBF16_INDEX_K = [1, 0]\n\n\
    [[cell]]\nkind = \"load\"\nflag = \"BF16_INDEX_K\"\nlevels = [1, 16, 64]\nsessions = 80\nflags = { HICACHE = \"on\" }\n";

#[test]
fn a_load_cell_is_a_restart_group_of_its_own_after_the_axes() {
    let plan = parse(WITH_LOAD).unwrap();
    assert_eq!(plan.cells.len(), 9);
    let load = plan.cells.last().unwrap();
    assert_eq!(load.id, "load,ab=BF16_INDEX_K,HICACHE=on,l1+16+64,s80");
    assert_eq!(load.group, 4);
    assert_eq!(load.sessions, 80);
    let sweep = load.load.as_ref().unwrap();
    assert_eq!(sweep.levels, [1, 16, 64]);
    assert_eq!(sweep.flag.as_ref().unwrap().name, "BF16_INDEX_K");
    assert_eq!(sweep.allocation, Allocation::Fixed { sessions: 80 });
    assert!(plan.cells[..8].iter().all(|c| c.load.is_none()));
    // Its answer depends on alpha and min_effect: they are its configuration.
    let stricter = parse(&format!("alpha = 0.001\n{WITH_LOAD}")).unwrap();
    assert_ne!(stricter.cells[8].config_hash, load.config_hash);
    assert_eq!(stricter.cells[0].config_hash, plan.cells[0].config_hash);
    // Adaptive, without a flag (every level against the lowest), alone in a plan.
    let alone = parse(
        "name = \"t\"\nworkload = \"smoke\"\n[[cell]]\nkind = \"load\"\nlevels = [1, 64]\nmax_sessions = 128\n",
    )
    .unwrap();
    assert_eq!(alone.cells.len(), 1);
    assert_eq!(alone.cells[0].id, "load,l1+64,max128");
    assert_eq!(alone.cells[0].group, 0);
    assert_eq!(
        alone.cells[0].load.as_ref().unwrap().allocation,
        Allocation::Adaptive { max_sessions: 128 }
    );
}

#[test]
fn load_cell_mistakes_name_their_line_and_fix() {
    let cases: [(String, usize, &str); 8] = [
        (
            WITH_LOAD.replace("kind = \"load\"", "kind = \"sweep\""),
            10,
            "unknown cell kind \"sweep\"",
        ),
        (
            WITH_LOAD.replace("levels = [1, 16, 64]", "levels = [16, 1]"),
            12,
            "not strictly ascending",
        ),
        (
            WITH_LOAD.replace("flags = { HICACHE = \"on\" }\n", ""),
            9,
            "the plan's cells set [BF16_INDEX_K, HICACHE]",
        ),
        (
            WITH_LOAD.replace("sessions = 80", "sessions = 80\nmax_sessions = 200"),
            13,
            "both sessions",
        ),
        (
            WITH_LOAD.replace("sessions = 80", "max_sessions = 40"),
            13,
            "below the highest level 64",
        ),
        (
            WITH_LOAD.replace(
                "HICACHE = \"on\" }",
                "HICACHE = \"on\", BF16_INDEX_K = \"1\" }",
            ),
            14,
            "also fixed",
        ),
        (
            format!("{WITH_LOAD}\n[set]\nHICACHE = \"on\"\n"),
            17,
            "both pinned",
        ),
        (
            "name = \"t\"\n[[cell]]\nflags = { HICACHE = \"on\" }\nsessions = 4\nlevels = [1, 8]\n"
                .into(),
            5,
            "levels is a key of load cells",
        ),
    ];
    for (text, line, words) in cases {
        let (at, msg) = error_line(&text);
        assert_eq!(at, line, "{words}: {msg}");
        assert!(msg.contains(words), "{words}: {msg}");
    }
    let shown = parse(&WITH_LOAD.replace("kind = \"load\"", "kind = \"sweep\""))
        .unwrap_err()
        .to_string();
    assert!(
        shown.starts_with("plans/t.toml:10: unknown cell kind")
            && shown.contains("fix: use kind = \"load\""),
        "{shown}"
    );
    let (_, msg) = error_line(&WITH_LOAD.replace("levels = [1, 16, 64]\n", ""));
    assert!(
        msg.contains("has no levels") && msg.contains("levels = [1, 16, 64]"),
        "{msg}"
    );
    let (_, msg) = error_line("name = \"t\"\n[[cell]]\nsessions = 4\n");
    assert!(msg.contains("this [[cell]] has no flags"), "{msg}");
}

#[test]
fn the_load_cell_example_of_docs_load_md_is_a_valid_plan() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/load.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let section = &doc[doc.find("## In the matrix").unwrap()..];
    let start = section.find("```toml\n").unwrap() + "```toml\n".len();
    let example = &section[start..start + section[start..].find("```").unwrap()];
    let plan = parse(example).unwrap();
    let load = plan.cells.last().unwrap();
    assert_eq!(load.id, "load,ab=BF16_INDEX_K,HICACHE=on,l1+16+32+64,s160");
    assert!(
        doc.contains(&format!("`{}`", load.id)),
        "the doc names the id"
    );
}
