//! The search's state machine on scripted, deterministic oracles: the order of the ends,
//! the stopping rule, untestable commits widening the answer, the budget, and the
//! verification.

use super::search::{Action, Answer, Observation, Params, Purpose, Search, Spent, Test};

fn block(corrupted: u64) -> Observation {
    Observation::Block {
        corrupted,
        judged: 80,
    }
}

/// Runs the search to its answer; every step's (commit, purpose).
fn drive(params: Params, oracle: impl Fn(usize) -> Observation) -> (Answer, Vec<(usize, Purpose)>) {
    let step_sessions = params.step_sessions();
    let mut search = Search::new(params);
    let mut steps = Vec::new();
    loop {
        let round = match search.next_round() {
            Action::Done(answer) => return (answer, steps),
            Action::Round(round) => round,
        };
        for test in round {
            steps.push((test.commit, test.purpose));
            let obs = oracle(test.commit);
            let sessions = if matches!(obs, Observation::Untestable { .. }) {
                0
            } else {
                step_sessions
            };
            let spent = Spent {
                build_s: Some(10.0),
                block_s: Some(5.0),
                sessions,
            };
            search.observe(test, &obs, spent);
        }
        assert!(steps.len() < 500, "the search does not end");
    }
}

#[test]
fn ends_first_bad_then_good_then_the_middle() {
    // 8 commits after the good end; commit 5 turns 0/80 into 15/80.
    let (answer, steps) = drive(Params::new(9, 80, 80), |c| {
        block(if c >= 5 { 15 } else { 0 })
    });
    assert_eq!(steps[0], (8, Purpose::Ends));
    assert_eq!(steps[1], (0, Purpose::Ends));
    let first_search = steps.iter().find(|s| s.1 == Purpose::Search).unwrap();
    assert_eq!(first_search.0, 4, "{steps:?}");
    match &answer {
        Answer::Culprit {
            first,
            last,
            parent,
            verified,
            posterior,
            words,
        } => {
            assert_eq!((*first, *last, *parent), (5, 5, 4));
            assert!(*verified, "{words}");
            assert!(*posterior >= 0.99);
            assert!(
                words.starts_with("commit 5 raises corruption from 0/"),
                "{words}"
            );
            assert!(words.contains("at 80 in flight"), "{words}");
        }
        other => panic!("{other:?}"),
    }
    // Verification runs the culprit, then its parent, alternating.
    let verify: Vec<usize> = steps
        .iter()
        .filter(|s| s.1 == Purpose::Verify)
        .map(|s| s.0)
        .collect();
    assert!(verify.len() >= 2 && verify.len() % 2 == 0, "{verify:?}");
    assert!(verify.chunks(2).all(|p| p == [5, 4]), "{verify:?}");
}

#[test]
fn untestable_commits_widen_the_answer_to_a_range() {
    // Commits 3 and 4 cannot be built; the culprit is 5: the first bad commit may be 3,
    // 4 or 5, and 2 is its parent.
    let (answer, _) = drive(Params::new(9, 80, 80), |c| match c {
        3 | 4 => Observation::Untestable {
            reason: "build failed".into(),
        },
        c => block(if c >= 5 { 15 } else { 0 }),
    });
    match answer {
        Answer::Culprit {
            first,
            last,
            parent,
            verified,
            words,
            ..
        } => {
            assert_eq!((first, last, parent, verified), (3, 5, 2, true), "{words}");
            assert!(
                words.starts_with("commits 3..=5 (untestable between)"),
                "{words}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_clean_bad_end_is_could_not_reproduce() {
    // 0/80 at both ends: after one look the bad end's always-valid 97.5% upper bound is
    // above 5%, after two (0/160) below it.
    let (answer, steps) = drive(Params::new(9, 80, 8), |_| block(0));
    assert_eq!(steps.len(), 4, "{steps:?}");
    match answer {
        Answer::CouldNotReproduce { words } => {
            assert!(words.contains("at 8 in flight"), "{words}");
            assert!(words.contains("bad end 0/160"), "{words}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ends_that_do_not_differ_are_no_culprit() {
    // 6/80 at both ends: never implicated; the always-valid interval for the difference
    // narrows into +-5% given enough blocks.
    let params = Params {
        cap_blocks: 60,
        ..Params::new(9, 80, 80)
    };
    let (answer, steps) = drive(params, |_| block(6));
    assert!(steps.iter().all(|s| s.1 == Purpose::Ends));
    match answer {
        Answer::NoCulprit { words } => assert!(
            words.starts_with("no culprit: the ends do not differ"),
            "{words}"
        ),
        other => panic!("{other:?}"),
    }
    // Within a cap of 10 blocks per end it stays undecided.
    let params = Params {
        cap_blocks: 10,
        ..Params::new(9, 80, 80)
    };
    let (answer, steps) = drive(params, |_| block(6));
    assert_eq!(steps.len(), 20);
    assert!(matches!(answer, Answer::Inconclusive { .. }), "{answer:?}");
    assert!(
        answer.words().contains("undecided after 10 blocks each"),
        "{answer:?}"
    );
}

#[test]
fn could_not_tell_weighs_nothing_and_repeated_makes_a_commit_untestable() {
    // Commit 4 never tells (its load falls short): after 3 tries it is untestable, and
    // the answer (culprit 4) widens to 4..=5... no: 4 is untestable, so 4 joins 5.
    let (answer, steps) = drive(Params::new(9, 80, 80), |c| match c {
        4 => Observation::CouldNotTell {
            reason: "load fell short".into(),
        },
        c => block(if c >= 4 { 15 } else { 0 }),
    });
    assert_eq!(steps.iter().filter(|s| s.0 == 4).count(), 3, "{steps:?}");
    match answer {
        Answer::Culprit {
            first,
            last,
            parent,
            ..
        } => assert_eq!((first, last, parent), (4, 5, 3)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_budget_ends_the_search_inconclusive_with_its_top_candidates() {
    // 5% vs 1%-ish: the budget of 6 blocks runs out.
    let params = Params {
        max_sessions: 480,
        ..Params::new(9, 80, 80)
    };
    let (answer, steps) = drive(params, |c| block(if c >= 5 { 4 } else { 1 }));
    assert_eq!(steps.len(), 6);
    match answer {
        Answer::Inconclusive { words, top } => {
            assert!(words.contains("budget of 480 sessions is spent"), "{words}");
            assert_eq!(top.len(), 3);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_culprit_that_does_not_hold_up_is_unverified() {
    // The search's blocks at 5 said 15/80, its fresh verification blocks say 0/80: the
    // e-process never implicates it, and with one verification allowed that is the end.
    let seen = std::cell::Cell::new(0u32);
    let one_try = Params {
        max_verifications: 1,
        ..Params::new(9, 80, 80)
    };
    let (answer, _) = drive(one_try, |c| {
        if c == 5 {
            seen.set(seen.get() + 1);
        }
        let at_5 = if seen.get() <= 1 { 15 } else { 0 };
        block(match c {
            5 => at_5,
            c if c > 5 => 15,
            _ => 0,
        })
    });
    match answer {
        Answer::Culprit {
            verified, words, ..
        } => {
            assert!(!verified);
            assert!(words.starts_with("verification failed"), "{words}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_parameters_are_refused_with_the_option() {
    let mut p = Params::new(9, 80, 80);
    p.alpha = 1.5;
    assert!(p.validate().unwrap_err().contains("--alpha"));
    let p = Params {
        max_sessions: 100,
        ..Params::new(9, 80, 80)
    };
    assert!(p.validate().unwrap_err().contains("--max-sessions 100"));
    assert!(Params::new(1, 80, 80).validate().is_err());
    assert!(Params::new(9, 80, 80).validate().is_ok());
}

/// `--flag F`: a pair whose on arm corrupts `on` and off arm `off` of 80 each.
fn pair(on: u64, off: u64) -> Observation {
    let c = |corrupted| super::Counts {
        corrupted,
        judged: 80,
    };
    Observation::Pair {
        on: c(on),
        off: c(off),
    }
}

fn flagged() -> Params {
    Params {
        flag: Some("F".into()),
        ..Params::new(9, 80, 80)
    }
}

#[test]
fn with_a_flag_the_on_arm_is_searched_and_the_off_arm_at_the_culprit_must_be_clean() {
    // Commit 5 makes F on corrupt; F off stays clean everywhere.
    let (answer, steps) = drive(flagged(), |c| pair(if c >= 5 { 15 } else { 0 }, 0));
    match &answer {
        Answer::Culprit {
            first,
            last,
            verified,
            words,
            ..
        } => {
            assert_eq!((*first, *last), (5, 5));
            assert!(*verified, "{words}");
            assert!(
                words.starts_with("commit 5 raises corruption with F on from 0/"),
                "{words}"
            );
            assert!(words.contains("; F off there 0/"), "{words}");
            assert!(
                words.contains(", clean: below the on arm's 18.8%"),
                "{words}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(steps.len() < 30, "{steps:?}");
}

#[test]
fn with_a_flag_a_rise_the_off_arm_shares_is_not_verified() {
    // From commit 5, F off corrupts 4/80 in every pair (each pair alone is not above the
    // 2% background) and F on 8/80: pooled at the culprit, the off arm is above it.
    let (answer, _) = drive(flagged(), |c| if c >= 5 { pair(8, 4) } else { pair(0, 0) });
    match &answer {
        Answer::Culprit {
            last,
            verified,
            words,
            ..
        } => {
            assert_eq!(*last, 5);
            assert!(!verified, "{words}");
            assert!(
                words.starts_with("verification failed: commit 5"),
                "{words}"
            );
            assert!(
                words.contains("corrupts above the background 2.0%"),
                "{words}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn with_a_flag_a_step_costs_both_arms() {
    let p = Params {
        max_sessions: 480,
        ..flagged()
    };
    assert_eq!(p.step_sessions(), 160);
    // Three steps of 160: the ends' first pair and one more.
    let (answer, steps) = drive(p, |_| pair(4, 1));
    assert_eq!(steps.len(), 3, "{steps:?}");
    assert!(
        answer.words().contains("a step is 160"),
        "{}",
        answer.words()
    );
    let p = Params {
        max_sessions: 300,
        ..flagged()
    };
    assert!(p
        .validate()
        .unwrap_err()
        .contains("--max-sessions 300 cannot pay for one step at each end (160 sessions each)"));
}

#[test]
fn with_a_flag_the_could_not_reproduce_words_name_the_arm() {
    let (answer, _) = drive(flagged(), |_| pair(0, 0));
    assert!(
        answer
            .words()
            .starts_with("could not reproduce: the bad end with F on corrupts below 5.0%"),
        "{}",
        answer.words()
    );
}

#[test]
fn a_failed_verification_sends_the_search_back_and_names_the_drift() {
    // Commit 5 turns 0/80 into 15/80, but while the machine was busy (the search's first
    // blocks) the race did not fire: commits after 5 looked clean and the posterior
    // settled on a later commit. Its verification against its parent (both bad again)
    // fails, says the rate drifted, and the search goes back, now naming 5.
    let calls = std::cell::Cell::new(0u32);
    let (answer, steps) = drive(Params::new(9, 80, 80), |c| {
        let n = calls.get();
        calls.set(n + 1);
        let busy = (4..7).contains(&n);
        block(if c >= 5 && !busy { 15 } else { 0 })
    });
    let verifications = steps
        .windows(2)
        .filter(|w| w[0].1 != Purpose::Verify && w[1].1 == Purpose::Verify)
        .count();
    assert_eq!(verifications, 2, "{steps:?}");
    match &answer {
        Answer::Culprit {
            first,
            verified,
            words,
            ..
        } => {
            assert_eq!(*first, 5, "{words}");
            assert!(*verified, "{words}");
            assert!(words.contains("earlier: verification failed"), "{words}");
            assert!(
                words.contains("commit 7 gave 0/80 (0.0%) in the search and 15/80"),
                "{words}"
            );
            assert!(words.contains("drifted during the search"), "{words}");
        }
        other => panic!("{other:?}"),
    }
}

/// Runs the search to its answer with `parallel` blocks a round; every round.
fn drive_rounds(
    parallel: u32,
    commits: usize,
    oracle: impl Fn(usize) -> Observation,
) -> (Answer, Vec<Vec<Test>>) {
    let mut params = Params::new(commits, 80, 80);
    params.parallel = parallel;
    let mut search = Search::new(params);
    let mut rounds = Vec::new();
    loop {
        let round = match search.next_round() {
            Action::Done(answer) => return (answer, rounds),
            Action::Round(round) => round,
        };
        for &test in &round {
            let spent = Spent {
                build_s: Some(10.0),
                block_s: Some(5.0),
                sessions: 80,
            };
            search.observe(test, &oracle(test.commit), spent);
        }
        rounds.push(round);
        assert!(rounds.len() < 200, "the search does not end");
    }
}

#[test]
fn a_round_runs_k_distinct_commits_and_each_pair_at_once() {
    // 64 commits after the good end; commit 23 turns 0/80 into 15/80.
    let oracle = |c: usize| block(if c >= 23 { 15 } else { 0 });
    let (answer, rounds) = drive_rounds(4, 65, oracle);
    let t = |commit, purpose| Test { commit, purpose };
    assert_eq!(rounds[0], vec![t(64, Purpose::Ends), t(0, Purpose::Ends)]);
    for round in &rounds[1..] {
        let mut commits: Vec<usize> = round.iter().map(|t| t.commit).collect();
        commits.dedup();
        assert_eq!(commits.len(), round.len(), "{round:?}");
        match round[0].purpose {
            Purpose::Search => {
                assert!(round.len() <= 4 && round.windows(2).all(|w| w[0].commit < w[1].commit))
            }
            Purpose::Verify => {
                assert_eq!(round, &vec![t(23, Purpose::Verify), t(22, Purpose::Verify)])
            }
            Purpose::Ends => assert_eq!(round, &rounds[0]),
        }
    }
    assert!(
        matches!(
            answer,
            Answer::Culprit {
                first: 23,
                last: 23,
                verified: true,
                ..
            }
        ),
        "{answer:?}"
    );
    // The first search round splits the 64 candidate culprits in five (13 or 12 each:
    // equal information, a tie).
    let first = rounds
        .iter()
        .find(|r| r[0].purpose == Purpose::Search)
        .unwrap();
    let mut edges = vec![0];
    edges.extend(first.iter().map(|t| t.commit));
    edges.push(64);
    assert!(
        edges.windows(2).all(|w| (12..=13).contains(&(w[1] - w[0]))),
        "{first:?}"
    );
    // Fewer rounds than one block at a time takes steps, for a few more blocks.
    let (one, steps) = drive_rounds(1, 65, oracle);
    assert!(
        matches!(
            one,
            Answer::Culprit {
                first: 23,
                last: 23,
                verified: true,
                ..
            }
        ),
        "{one:?}"
    );
    let blocks: usize = rounds.iter().map(Vec::len).sum();
    assert!(
        rounds.len() * 2 <= steps.len(),
        "{} rounds vs {} steps",
        rounds.len(),
        steps.len()
    );
    assert!(
        blocks <= steps.len() * 2,
        "{blocks} blocks vs {} steps",
        steps.len()
    );
}

#[test]
fn a_search_block_observed_after_the_stop_is_no_verification_look() {
    // 8 commits after the good end, commit 5 the culprit. The round's first block makes
    // the posterior stop on 5; the round's next block, at 5 too in spirit (a search
    // block at the verification's commit), feeds the posterior but is no look.
    let mut params = Params::new(9, 80, 80);
    params.parallel = 2;
    let mut search = Search::new(params);
    let spent = Spent {
        build_s: Some(10.0),
        block_s: Some(5.0),
        sessions: 80,
    };
    let observe = |search: &mut Search, commit, purpose, k| {
        search.observe(Test { commit, purpose }, &block(k), spent)
    };
    for _ in 0..2 {
        observe(&mut search, 8, Purpose::Ends, 15);
        observe(&mut search, 0, Purpose::Ends, 0);
    }
    let mut stopped = false;
    for (commit, k) in [(4, 0), (5, 15)].repeat(5) {
        observe(&mut search, commit, Purpose::Search, k);
        if let Action::Round(round) = search.next_round() {
            if round[0].purpose == Purpose::Verify {
                stopped = true;
                break;
            }
        }
    }
    assert!(stopped, "the search never stopped on a culprit");
    let before = search.counts()[5];
    observe(&mut search, 5, Purpose::Search, 15);
    assert_eq!(search.counts()[5].judged, before.judged + 80);
    assert!(search.ab().looks().is_empty(), "{:?}", search.ab().looks());
    let Action::Round(round) = search.next_round() else {
        panic!("no verification")
    };
    let t = |commit| Test {
        commit,
        purpose: Purpose::Verify,
    };
    assert_eq!(round, vec![t(5), t(4)]);
}
