//! The root cause in an engine's log, for the message of a start that failed: the tail
//! alone is often the last process's summary ("Engine core initialization failed. See
//! root cause above", vLLM) while the cause lies a hundred lines up, in another process's
//! traceback. Pure: log text in, the lines that name the cause out.
//!
//! The rule, in order:
//! 1. The exception that ends the log's first Python traceback: the first line after
//!    "Traceback (most recent call last):" that reads `SomethingError: message` (or
//!    `...Exception: ...`), whatever prefix the logger or the process put before it
//!    (`(EngineCore_DP0 pid=41) ERROR 12-03 09:12:44 [core.py:712] ValueError: ...`).
//!    Later tracebacks are usually the same failure re-raised by the parent process.
//! 2. Otherwise the first line that says `error`, `fatal`, `panicked`, `abort` or
//!    `segmentation fault` as a word (llama.cpp's "error: ...", a C++ `terminate called`
//!    line, a Rust panic), or that llama.cpp's log marks with level `E`, skipping lines
//!    that only report a count of errors as zero.

use std::sync::LazyLock;

use regex::Regex;

/// Whether a log line is the engine echoing one of bisect's own polls (its access log of
/// a `GET` of `/metrics`, `/health`, `/props`, `/server_info`, `/get_server_info`,
/// `/v1/models`): llama-server at `-lv 1` logs "request: GET /metrics 127.0.0.1 200",
/// uvicorn (vLLM, SGLang) `"GET /metrics HTTP/1.1" 200 OK`. Four polls a second fill a
/// dying engine's last lines with these; the lines that say what it was doing are the
/// others.
pub fn is_poll_echo(line: &str) -> bool {
    static POLL: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r#"\bGET /(metrics|health|props|server_info|get_server_info|v1/models)(?:[\s?"]|$)"#,
        )
        .unwrap()
    });
    POLL.is_match(line)
}

/// The last `n` lines of `log` that are not [`is_poll_echo`], and how many such echoes
/// were passed over among the lines kept's span.
pub fn tail_without_polls(log: &str, n: usize) -> (Vec<String>, usize) {
    let mut kept = Vec::new();
    let mut skipped = 0;
    for line in log.lines().rev() {
        if kept.len() == n {
            break;
        }
        if is_poll_echo(line) {
            skipped += 1;
        } else {
            kept.push(line.to_string());
        }
    }
    kept.reverse();
    (kept, skipped)
}

/// The lines that name the cause, with their 1-based line numbers, at most `max`.
pub fn root_cause(log: &str, max: usize) -> Vec<(usize, String)> {
    static EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?:^|[\s\]:)])(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Z][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt)(?::\s|$)").unwrap()
    });
    static WORD: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)\b(error|fatal|panicked|abort(ed)?|segmentation fault|terminate called)\b")
            .unwrap()
    });
    // llama.cpp's own log format: a timestamp, then the level letter (E for error).
    static LEVEL_E: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^\d+\.\d+\.\d+\.\d+ E ").unwrap());
    static NOTHING_WRONG: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?i)\b(0|no) errors?\b|errors?[=:]\s*0\b").unwrap());
    let lines: Vec<&str> = log.lines().collect();
    let take = |start: usize, keep: &dyn Fn(&str) -> bool| -> Vec<(usize, String)> {
        lines
            .iter()
            .enumerate()
            .skip(start)
            .filter(|(_, l)| keep(l))
            .take(max)
            .map(|(i, l)| (i + 1, l.trim_end().to_string()))
            .collect()
    };
    if let Some(tb) = lines
        .iter()
        .position(|l| l.contains("Traceback (most recent call last):"))
    {
        let exception = take(tb + 1, &|l| EXCEPTION.is_match(l));
        if let Some((n, line)) = exception.into_iter().next() {
            // Its message may go on below it, indented (pydantic's "1 validation error
            // for X" then the error itself), before the next frame or log line.
            let mut cause = vec![(n, line)];
            for (i, l) in lines.iter().enumerate().skip(n) {
                let detail = l.starts_with("  ") && !l.trim_start().starts_with("File \"");
                if !detail || l.trim().chars().all(|c| c == '^' || c == '~') || cause.len() >= max {
                    break;
                }
                cause.push((i + 1, l.trim_end().to_string()));
            }
            return cause;
        }
    }
    take(0, &|l| {
        (WORD.is_match(l) || LEVEL_E.is_match(l)) && !NOTHING_WRONG.is_match(l)
    })
}

/// The cause as a message paragraph: "the first error in LOG (line N): ..." lines, or
/// nothing when the log names none.
pub fn root_cause_words(log: &str, log_name: &str) -> String {
    let cause = root_cause(log, 3);
    if cause.is_empty() {
        return String::new();
    }
    let lines: Vec<String> = cause
        .iter()
        .map(|(n, l)| format!("  line {n}: {}", super::format::clip(l, 400)))
        .collect();
    format!("the first error in {log_name}:\n{}\n", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_traceback_s_exception_is_the_cause_not_the_parent_s_summary() {
        let log = "\
INFO 12-03 09:12:01 [api_server.py:1] vLLM API server version 0.32.0
(EngineCore_DP0 pid=41) INFO 12-03 09:12:40 [core.py:90] Initializing a V1 LLM engine
(EngineCore_DP0 pid=41) ERROR 12-03 09:12:44 [core.py:712] EngineCore failed to start.
(EngineCore_DP0 pid=41) ERROR 12-03 09:12:44 [core.py:712] Traceback (most recent call last):
(EngineCore_DP0 pid=41) ERROR 12-03 09:12:44 [core.py:712]   File \"core.py\", line 703, in run_engine_core
(EngineCore_DP0 pid=41) ERROR 12-03 09:12:44 [core.py:712]     raise ValueError(msg)
(EngineCore_DP0 pid=41) ERROR 12-03 09:12:44 [core.py:712] ValueError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.
Traceback (most recent call last):
  File \"api_server.py\", line 9, in <module>
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
";
        let cause = root_cause(log, 3);
        assert_eq!(cause.len(), 1);
        assert_eq!(cause[0].0, 7);
        assert!(cause[0]
            .1
            .ends_with("ValueError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."));
        let words = root_cause_words(log, "logs/on-r0-server.log");
        assert!(
            words.starts_with("the first error in logs/on-r0-server.log:\n  line 7: "),
            "{words}"
        );
    }

    #[test]
    fn without_a_traceback_the_first_error_word_and_never_a_count_of_none() {
        let log = "\
build: 4941 (8733e0c) with cc
main: 0 errors while loading the vocabulary
llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' has wrong shape
llama_load_model_from_file: failed to load model
srv    load_model: failed to load model, 'model.gguf'
main: exiting due to model loading error
";
        let cause = root_cause(log, 2);
        assert_eq!(
            cause,
            [
                (3, "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' has wrong shape".into()),
                (6, "main: exiting due to model loading error".into()),
            ]
        );
        assert_eq!(root_cause("all good\nready\n", 3), []);
        assert_eq!(root_cause_words("all good\n", "x.log"), "");
        let panic = "starting\nthread 'main' panicked at src/main.rs:3:5:\nboom\n";
        assert_eq!(root_cause(panic, 1)[0].0, 2);
    }

    /// Real vLLM logs (the CPU wheel 0.32.0, tests/fixtures/engines/vllm/cpu-0.32.0/).
    #[test]
    fn a_real_vllm_start_failure_names_its_validation_error_and_its_message() {
        let log = crate::testing::engine_fixture("vllm/cpu-0.32.0/start-failure-max-model-len.log");
        let cause = root_cause(&log, 3);
        assert!(
            cause[0]
                .1
                .ends_with("ValidationError: 1 validation error for ModelConfig"),
            "{cause:?}"
        );
        assert!(
            cause[1].1.contains(
                "User-specified max_model_len (100000) is greater than the derived max_model_len"
            ),
            "{cause:?}"
        );
        // Killed while its worker profiled memory (fp8 KV cache on AVX2): the engine
        // core's own exception, not the API server's summary after it.
        let killed = crate::testing::engine_fixture("vllm/cpu-0.32.0/start-killed-fp8-kv.log");
        let cause = root_cause(&killed, 3);
        assert!(cause[0].1.starts_with("(EngineCore pid="), "{cause:?}");
        assert!(cause[0].1.ends_with("RuntimeError: cancelled"), "{cause:?}");
    }

    #[test]
    fn llama_cpp_s_error_level_marks_the_cause_without_the_word() {
        // A 0.3.36 llama-server that could not bind its port (a release search's block).
        let log = "\
0.00.001.840 W DEPRECATED: --defrag-thold is deprecated and no longer necessary to specify
0.00.006.051 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8094
0.00.006.242 E srv  llama_server: exiting due to HTTP server error
";
        let cause = root_cause(log, 1);
        assert_eq!(cause[0].0, 2);
        assert!(cause[0].1.contains("couldn't bind HTTP server socket"));
    }

    #[test]
    fn a_traceback_without_an_exception_line_falls_back_to_the_words() {
        // Cut off mid-traceback (the process was killed while printing).
        let log =
            "ERROR starting the worker\nTraceback (most recent call last):\n  File \"x.py\"\n";
        assert_eq!(
            root_cause(log, 1),
            [(1, "ERROR starting the worker".into())]
        );
    }

    #[test]
    fn bisects_own_polls_are_left_out_of_a_dying_engines_tail() {
        let log = "\
slot update_slots: id  2 | task 812 | kv cache rm [1024, end)
srv  log_server_r: request: GET /metrics 127.0.0.1 200
srv  log_server_r: request: GET /health 127.0.0.1 200
update_slots: fragmentation: 0.12 - requesting defrag
INFO:     127.0.0.1:50412 - \"GET /metrics HTTP/1.1\" 200 OK
srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200
srv  log_server_r: request: GET /metrics 127.0.0.1 200";
        assert!(is_poll_echo(
            "srv  log_server_r: request: GET /metrics 127.0.0.1 200"
        ));
        assert!(is_poll_echo(
            "INFO:     127.0.0.1:50412 - \"GET /health HTTP/1.1\" 200 OK"
        ));
        // A chat request, and a log line that merely names the path, are kept.
        assert!(!is_poll_echo(
            "srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200"
        ));
        assert!(!is_poll_echo("main: server is listening on /metrics too"));
        let (tail, skipped) = tail_without_polls(log, 3);
        assert_eq!(
            tail,
            vec![
                "slot update_slots: id  2 | task 812 | kv cache rm [1024, end)",
                "update_slots: fragmentation: 0.12 - requesting defrag",
                "srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200",
            ]
        );
        assert_eq!(skipped, 4);
    }
}
