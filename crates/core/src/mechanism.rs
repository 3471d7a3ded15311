//! Whether the code path a flag controls ran (docs/design.md 3.3 "Mechanism witnesses",
//! 3.7 "No verdict clears a mechanism that never ran"). A flag file can name its
//! mechanism and what shows it running, its witnesses: an engine counter, a pattern over
//! a role's log, or a field of an engine endpoint, each counted over a block (the
//! harness reads them: arm/witness.rs). This module owns the vocabulary, the per-block
//! record, its pooling over blocks, and the one rule every clean answer obeys: `cleared`,
//! a probe's "clean", a matrix "ok", a culprit "pass" and a load sweep's "no threshold"
//! each need the mechanism to have run, at least each witness's minimum, in the arms
//! whose flag value lets it run. Otherwise the answer is inconclusive, with the counts
//! in words and the flag's own fix (the workload parameter that reaches it).
//!
//! A mechanism is counted as run when any one of its witnesses reached its minimum:
//! witnesses are alternative views of one path (a counter where the engine has one, a
//! log line where it has not). Counts are lower bounds when a read failed: one that
//! reached its minimum still says the path ran; one below it with a failed read says
//! nothing, and "could not tell" never clears either.

use serde::{Deserialize, Serialize};

/// How a witness is read. The harness reads each over one engine life and adds the
/// lives of a block up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WitnessKind {
    /// A Prometheus counter (`name` or `name{label="v",...}`, the labels a subset of the
    /// sample's), read as its increase over the block.
    Counter { selector: String },
    /// Lines of the role's log, within the block's window, that match `pattern` (a
    /// regex). `level`: what the engine needs to print the line, in words, if anything.
    Log {
        pattern: String,
        level: Option<String>,
    },
    /// A number in a JSON document the role serves at `path` on its origin, at `field`
    /// (a JSON pointer in which a `*` segment sums every element), read at the block's
    /// start and end: the count is the rise.
    Endpoint { path: String, field: String },
}

/// One witness of a flag's mechanism, as its flag file names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witness {
    pub kind: WitnessKind,
    /// Only for targets of this engine preset (`embedded`, `sglang`, `vllm`,
    /// `llamacpp`); `None`: every engine.
    pub engine: Option<String>,
    /// Only this role; `None`: every role of the flag, added up.
    pub role: Option<String>,
    /// Counts below this are "never ran".
    pub min: u64,
    /// Where the engine's own source says so (file and line at the pinned version).
    pub source: String,
}

impl Witness {
    /// "log /requesting defrag/", "counter vllm:num_preemptions_total",
    /// "/slots at /*/n_past", with " of ROLE" when it names a role.
    pub fn words(&self) -> String {
        let what = match &self.kind {
            WitnessKind::Counter { selector } => format!("counter {selector}"),
            WitnessKind::Log { pattern, .. } => format!("log /{pattern}/"),
            WitnessKind::Endpoint { path, field } => format!("{path} at {field}"),
        };
        match &self.role {
            Some(role) => format!("{what} of {role}"),
            None => what,
        }
    }

    /// Whether this witness is read on `role` of a flag written into `flag_roles`: its
    /// own role, else every role of the flag.
    pub fn reads(&self, role: &str, flag_roles: &[String]) -> bool {
        match &self.role {
            Some(own) => own == role,
            None => flag_roles.iter().any(|r| r == role),
        }
    }

    /// Whether this witness applies to a target of engine preset `engine`.
    pub fn applies_to(&self, engine: &str) -> bool {
        self.engine.as_deref().is_none_or(|e| e == engine)
    }
}

/// The arms in which the flag's value lets the mechanism run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arms {
    /// Its `on` value enables it (any value but `off` does).
    On,
    /// Its `off` value enables it (any value but `on` does): a flag that disables a path.
    Off,
    /// It runs at either value; the flag changes how.
    Both,
}

impl Arms {
    pub fn as_str(self) -> &'static str {
        match self {
            Arms::On => "on",
            Arms::Off => "off",
            Arms::Both => "both",
        }
    }

    /// Whether `value` of a flag whose values are `(on, off)` lets the mechanism run. A
    /// value that is neither (a load level's or a `--set`'s) counts as enabling unless it
    /// is the one value that disables.
    pub fn enabled_by(self, (on, off): (&str, &str), value: &str) -> bool {
        match self {
            Arms::On => value != off,
            Arms::Off => value != on,
            Arms::Both => true,
        }
    }
}

/// How a flag's mechanism can be seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watch {
    /// By these witnesses (those for the target's engine are read).
    Witnesses(Vec<Witness>),
    /// Nowhere: the engine shows it neither in counters, logs nor endpoints; why.
    Unobservable(String),
}

/// A flag's mechanism, from the `[mechanism]` table of its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mechanism {
    /// What runs, a noun phrase: "defrag", "preemption".
    pub name: String,
    pub arms: Arms,
    /// Which workload parameter would make it run, said when it did not.
    pub fix: String,
    pub watch: Watch,
}

impl Mechanism {
    /// The witnesses read on a target of engine preset `engine`, in file order: the
    /// readings of a record ([`MechanismRecord::of`]) are these, index for index.
    pub fn witnesses_for(&self, engine: &str) -> Vec<&Witness> {
        match &self.watch {
            Watch::Witnesses(ws) => ws.iter().filter(|w| w.applies_to(engine)).collect(),
            Watch::Unobservable(_) => Vec::new(),
        }
    }
}

/// One witness's count over a block or an arm (`mechanisms[].witnesses[]` in run.json).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessReading {
    /// [`Witness::words`].
    pub witness: String,
    pub min: u64,
    /// What it counted where it was read (a lower bound when `unread` is not empty).
    pub count: u64,
    /// Why a read failed (an engine life whose log or endpoint could not be read), one
    /// line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<String>,
}

/// What a block or an arm saw of one flag's mechanism (`mechanisms[]` in run.json).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MechanismRecord {
    pub flag: String,
    /// The mechanism's name; empty when the flag file names none.
    pub name: String,
    /// The flag's value in this block.
    pub value: String,
    /// Whether that value lets the mechanism run ([`Arms::enabled_by`]).
    pub needed: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fix: String,
    /// Why nothing can show it: the engine shows it nowhere, or the flag file names no
    /// witness (or none for this engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unwatched: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub witnesses: Vec<WitnessReading>,
}

/// Whether a block or an arm ran the mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ran {
    /// A witness reached its minimum.
    Yes,
    /// Every witness was read and none reached its minimum.
    No,
    /// None reached its minimum and some could not be read.
    Unknown,
    /// Nothing can show it.
    Unwatched,
}

impl Ran {
    /// Two blocks' answers as one: ran if either ran; else unknown if either could not
    /// tell; else never ran if either was read; else unwatched.
    pub fn or(self, other: Ran) -> Ran {
        use Ran::*;
        match (self, other) {
            (Yes, _) | (_, Yes) => Yes,
            (Unknown, _) | (_, Unknown) => Unknown,
            (No, _) | (_, No) => No,
            (Unwatched, Unwatched) => Unwatched,
        }
    }
}

impl MechanismRecord {
    /// The mechanism's name in words: its own, or its flag's when the file names none.
    pub fn label(&self) -> String {
        if self.name.is_empty() {
            self.flag.clone()
        } else {
            self.name.clone()
        }
    }

    /// The record of flag `flag` (its file `file`, its values `values` = (on, off)) at
    /// `value`, whose mechanism is `mechanism` (or none), on an engine of preset
    /// `engine`, before anything is counted: one zero reading per witness that applies.
    /// `FlagSpec::mechanism_record` calls it with the flag's own fields.
    pub fn of(
        (flag, file): (&str, &str),
        mechanism: Option<&Mechanism>,
        values: (&str, &str),
        value: &str,
        engine: &str,
    ) -> MechanismRecord {
        let (name, fix, needed, unwatched, witnesses) = match mechanism {
            None => (
                String::new(),
                String::new(),
                true,
                Some(format!(
                    "{file} names no witness of its mechanism (a [mechanism] table)"
                )),
                vec![],
            ),
            Some(m) => {
                let (unwatched, witnesses) = match &m.watch {
                    Watch::Unobservable(why) => (Some(why.clone()), vec![]),
                    Watch::Witnesses(_) => {
                        let readings: Vec<WitnessReading> = m
                            .witnesses_for(engine)
                            .into_iter()
                            .map(|w| WitnessReading {
                                witness: w.words(),
                                min: w.min,
                                count: 0,
                                unread: vec![],
                            })
                            .collect();
                        let none = readings
                            .is_empty()
                            .then(|| format!("{flag} names no witness for the {engine} engine"));
                        (none, readings)
                    }
                };
                (
                    m.name.clone(),
                    m.fix.clone(),
                    m.arms.enabled_by(values, value),
                    unwatched,
                    witnesses,
                )
            }
        };
        MechanismRecord {
            flag: flag.to_string(),
            name,
            value: value.to_string(),
            needed,
            fix,
            unwatched,
            witnesses,
        }
    }

    pub fn ran(&self) -> Ran {
        if self.unwatched.is_some() || self.witnesses.is_empty() {
            return Ran::Unwatched;
        }
        if self.witnesses.iter().any(|w| w.count >= w.min) {
            Ran::Yes
        } else if self.witnesses.iter().any(|w| !w.unread.is_empty()) {
            Ran::Unknown
        } else {
            Ran::No
        }
    }

    /// The count in words: its greatest witness's count, "9" or "at least 2 (1 read
    /// failed)".
    fn count_words(&self) -> String {
        let Some(best) = self.witnesses.iter().max_by_key(|w| w.count) else {
            return "unwatched".into();
        };
        let unread: usize = self.witnesses.iter().map(|w| w.unread.len()).sum();
        if unread == 0 {
            best.count.to_string()
        } else {
            format!(
                "at least {} ({unread} read{} failed)",
                best.count,
                if unread == 1 { "" } else { "s" }
            )
        }
    }
}

/// Several blocks' records of one arm added up per flag: counts add, failed reads are
/// kept, a flag needed in any block is needed.
pub fn pool<'a>(blocks: impl IntoIterator<Item = &'a [MechanismRecord]>) -> Vec<MechanismRecord> {
    let mut pooled: Vec<MechanismRecord> = Vec::new();
    for records in blocks {
        for r in records {
            match pooled.iter_mut().find(|p| p.flag == r.flag) {
                None => pooled.push(r.clone()),
                Some(p) => {
                    p.needed |= r.needed;
                    for w in &r.witnesses {
                        match p.witnesses.iter_mut().find(|x| x.witness == w.witness) {
                            Some(x) => {
                                x.count += w.count;
                                x.unread.extend(w.unread.iter().cloned());
                            }
                            None => p.witnesses.push(w.clone()),
                        }
                    }
                }
            }
        }
    }
    pooled
}

/// What the mechanisms of a clean answer's arms came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// Every needed mechanism ran; its counts in words.
    Exercised(String),
    /// A needed mechanism did not run in an arm whose value enables it: the counts and
    /// the flag's fix.
    NeverRan { words: String, fix: String },
    /// Whether it ran could not be told (reads failed).
    Unknown(String),
    /// Nothing shows it; why.
    Unwatched(String),
}

impl Coverage {
    /// Why this coverage keeps a clean answer from standing ("the mechanism never ran:
    /// defrag: on 0, off 0; fix: ..."), or None when it lets it stand.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Coverage::NeverRan { words, fix } if fix.is_empty() => {
                Some(format!("the mechanism never ran: {words}"))
            }
            Coverage::NeverRan { words, fix } => Some(format!(
                "the mechanism never ran: {words}; to reach it: {fix}"
            )),
            Coverage::Unknown(words) => {
                Some(format!("could not tell whether the mechanism ran: {words}"))
            }
            Coverage::Exercised(_) | Coverage::Unwatched(_) => None,
        }
    }

    /// The counts in words, whatever they came to.
    pub fn counts(&self) -> &str {
        match self {
            Coverage::Exercised(w) | Coverage::Unknown(w) | Coverage::Unwatched(w) => w,
            Coverage::NeverRan { words, .. } => words,
        }
    }

    /// The line a record carries beside any answer.
    pub fn words(&self) -> String {
        match self {
            Coverage::Exercised(words) => format!("the mechanism ran: {words}"),
            Coverage::Unwatched(why) => {
                format!("whether the flag's mechanism ran is unknown: {why}")
            }
            other => other.refusal().unwrap_or_default(),
        }
    }
}

/// Judges the mechanisms of one answer's arms, given as (arm name, its records):
/// an A/B's two arms, or one block. None when no arm has a record (records made before
/// witnesses existed, or a block that set no flag).
///
/// Per flag, in the order first seen: every arm whose value enables the mechanism must
/// have run it. The worst flag decides: never ran, then unknown, then unwatched.
pub fn coverage(arms: &[(&str, &[MechanismRecord])]) -> Option<Coverage> {
    let mut flags: Vec<&str> = Vec::new();
    for (_, records) in arms {
        for r in *records {
            if !flags.contains(&r.flag.as_str()) {
                flags.push(&r.flag);
            }
        }
    }
    if flags.is_empty() {
        return None;
    }
    let mut worst: Option<(u8, Coverage)> = None;
    let mut exercised = Vec::new();
    for flag in flags {
        let of: Vec<(&str, &MechanismRecord)> = arms
            .iter()
            .filter_map(|(arm, records)| Some((*arm, records.iter().find(|r| r.flag == flag)?)))
            .collect();
        let first = of[0].1;
        let label = first.label();
        let witness = first
            .witnesses
            .iter()
            .map(|w| w.witness.as_str())
            .collect::<Vec<_>>()
            .join(" or ");
        let counts = of
            .iter()
            .map(|(arm, r)| format!("{arm} {}", r.count_words()))
            .collect::<Vec<_>>()
            .join(", ");
        let needed: Vec<&(&str, &MechanismRecord)> = of.iter().filter(|(_, r)| r.needed).collect();
        let words = match needed.as_slice() {
            [] => format!("{label} ({witness}): {counts}"),
            [(arm, _)] if of.len() > 1 => {
                format!("{label} ({witness}): {counts}; it runs only in {arm}")
            }
            _ => format!("{label} ({witness}): {counts}"),
        };
        let ran: Vec<Ran> = needed.iter().map(|(_, r)| r.ran()).collect();
        let (rank, c) = if let Some((_, r)) = of.iter().find(|(_, r)| r.ran() == Ran::Unwatched) {
            (
                1,
                Coverage::Unwatched(
                    r.unwatched
                        .clone()
                        .unwrap_or_else(|| format!("{flag} has no witness")),
                ),
            )
        } else if ran.contains(&Ran::No) {
            (
                3,
                Coverage::NeverRan {
                    words,
                    fix: first.fix.clone(),
                },
            )
        } else if ran.contains(&Ran::Unknown) {
            (2, Coverage::Unknown(words))
        } else {
            exercised.push(words);
            continue;
        };
        if worst.as_ref().is_none_or(|(r, _)| rank > *r) {
            worst = Some((rank, c));
        }
    }
    Some(match worst {
        Some((_, c)) => c,
        None => Coverage::Exercised(exercised.join("; ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DEFRAG's values (on, off).
    const VALUES: (&str, &str) = ("0.1", "-1");

    /// The record of DEFRAG with `mechanism` at `value` on `engine`.
    fn record(mechanism: Option<&Mechanism>, value: &str, engine: &str) -> MechanismRecord {
        MechanismRecord::of(
            ("DEFRAG", "flags/DEFRAG.toml"),
            mechanism,
            VALUES,
            value,
            engine,
        )
    }

    fn log_witness(engine: Option<&str>) -> Witness {
        Witness {
            kind: WitnessKind::Log {
                pattern: "requesting defrag".into(),
                level: None,
            },
            engine: engine.map(String::from),
            role: Some("server".into()),
            min: 1,
            source: "src/llama.cpp:1".into(),
        }
    }

    fn mech(arms: Arms) -> Mechanism {
        Mechanism {
            name: "defrag".into(),
            arms,
            fix: "raise --ctx".into(),
            watch: Watch::Witnesses(vec![log_witness(Some("llamacpp"))]),
        }
    }

    fn counted(m: &Mechanism, value: &str, n: u64) -> MechanismRecord {
        let mut r = record(Some(m), value, "llamacpp");
        r.witnesses[0].count = n;
        r
    }

    #[test]
    fn the_arm_whose_value_enables_it_must_run_it() {
        let f = mech(Arms::On);
        let (on, off) = (counted(&f, "0.1", 0), counted(&f, "-1", 0));
        assert!(on.needed && !off.needed);
        let c = coverage(&[("on", &[on]), ("off", &[off])]).unwrap();
        assert_eq!(
            c.refusal().unwrap(),
            "the mechanism never ran: defrag (log /requesting defrag/ of server): on 0, off 0; \
             it runs only in on; to reach it: raise --ctx"
        );
        // Ran in the off arm only (the flag disables it there: a witness that also
        // counts something else) still leaves the on arm unexercised.
        let c = coverage(&[
            ("on", &[counted(&f, "0.1", 0)]),
            ("off", &[counted(&f, "-1", 5)]),
        ]);
        assert!(matches!(c, Some(Coverage::NeverRan { .. })));
        let c = coverage(&[
            ("on", &[counted(&f, "0.1", 9)]),
            ("off", &[counted(&f, "-1", 0)]),
        ]);
        assert_eq!(
            c.unwrap().words(),
            "the mechanism ran: defrag (log /requesting defrag/ of server): on 9, off 0; \
             it runs only in on"
        );
    }

    #[test]
    fn both_arms_must_run_a_mechanism_either_value_runs() {
        let f = mech(Arms::Both);
        let c = coverage(&[
            ("on", &[counted(&f, "0.1", 3)]),
            ("off", &[counted(&f, "-1", 0)]),
        ]);
        assert!(matches!(c, Some(Coverage::NeverRan { .. })));
        let c = coverage(&[
            ("on", &[counted(&f, "0.1", 3)]),
            ("off", &[counted(&f, "-1", 1)]),
        ]);
        assert!(matches!(c, Some(Coverage::Exercised(_))));
    }

    #[test]
    fn a_flag_that_disables_a_path_needs_it_in_its_off_arm() {
        let f = mech(Arms::Off);
        assert!(f.arms.enabled_by(VALUES, "-1") && !f.arms.enabled_by(VALUES, "0.1"));
        // A value that is neither on nor off enables unless it is the disabling one.
        assert!(Arms::On.enabled_by(VALUES, "0.05") && Arms::Off.enabled_by(VALUES, "0.05"));
    }

    #[test]
    fn minimums_failed_reads_and_unwatched_flags() {
        let mut m = mech(Arms::On);
        if let Watch::Witnesses(ws) = &mut m.watch {
            ws[0].min = 5;
        }
        let f = m;
        let below = counted(&f, "0.1", 4);
        assert_eq!(below.ran(), Ran::No);
        let mut unread = below.clone();
        unread.witnesses[0].unread.push("server.log: gone".into());
        assert_eq!(unread.ran(), Ran::Unknown);
        let c = coverage(&[("on", &[unread.clone()])]).unwrap();
        assert_eq!(
            c.refusal().unwrap(),
            "could not tell whether the mechanism ran: defrag (log /requesting defrag/ of \
             server): on at least 4 (1 read failed)"
        );
        // A count at its minimum is a lower bound that still says it ran.
        unread.witnesses[0].count = 5;
        assert_eq!(unread.ran(), Ran::Yes);

        let none = record(None, "0.1", "llamacpp");
        assert_eq!(none.ran(), Ran::Unwatched);
        let c = coverage(&[("on", &[none])]).unwrap();
        assert_eq!(c.refusal(), None);
        assert_eq!(
            c.words(),
            "whether the flag's mechanism ran is unknown: flags/DEFRAG.toml names no witness \
             of its mechanism (a [mechanism] table)"
        );
        // A witness for another engine does not apply.
        let other = record(Some(&f), "0.1", "vllm");
        assert!(other.witnesses.is_empty());
        assert_eq!(
            other.unwatched.as_deref(),
            Some("DEFRAG names no witness for the vllm engine")
        );
    }

    #[test]
    fn pooling_adds_counts_and_keeps_failed_reads() {
        let f = mech(Arms::On);
        let a = [counted(&f, "0.1", 2)];
        let mut b = [counted(&f, "0.1", 3)];
        b[0].witnesses[0].unread.push("life 2: log gone".into());
        let pooled = pool([&a[..], &b[..]]);
        assert_eq!(pooled.len(), 1);
        assert_eq!(pooled[0].witnesses[0].count, 5);
        assert_eq!(pooled[0].witnesses[0].unread.len(), 1);
        assert_eq!(coverage(&[]), None);
    }

    #[test]
    fn records_round_trip_through_json() {
        let f = mech(Arms::On);
        let r = counted(&f, "0.1", 7);
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<MechanismRecord>(&text).unwrap(), r);
        assert!(text.contains("\"needed\":true"), "{text}");
    }
}
