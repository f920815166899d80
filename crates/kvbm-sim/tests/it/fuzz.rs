//! Trace fuzzer: arbitrary JSONL traces mixing valid requests (extreme
//! timestamps and output lengths, prompts of 0 to 4 trace blocks) with
//! malformed and absurd lines (missing or extra-typed fields, negative
//! numbers, floats, strings, garbage, inconsistent `hash_ids`, outputs past
//! `u32::MAX`, timestamps past the clock), and blank lines.
//!
//! Properties: parsing never panics; a trace with a bad line is refused with
//! a typed error naming exactly the first bad line; a good one summarizes
//! without overflow and replays through cache mode (any capacity, any block
//! size, valid or not) and serve mode (small pools, audited every step) to
//! balanced accounting. `cargo xtask fuzz` runs it long.

use kvbm_sim::{
    CacheConfig, Capacity, Eviction, ServeConfig, ServeOutcome, SimError, Trace, Workload,
};
use proptest::prelude::*;

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (as `cargo xtask fuzz --cases N`
/// sets it), else a CI-sized default.
fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(512)
}

/// A line, and whether the parser must accept it (`None`: blank, skipped).
#[derive(Clone, Debug)]
struct Line {
    text: String,
    valid: Option<bool>,
}

fn valid_line() -> impl Strategy<Value = Line> {
    let timestamp = prop_oneof![4 => 0u64..5_000, 1 => Just(kvbm_sim::MAX_TIMESTAMP_MS)];
    let output = prop_oneof![6 => 0u64..6, 1 => Just(u64::from(u32::MAX))];
    (timestamp, 0usize..5, 1u64..=512, output, 0u64..6).prop_map(
        |(timestamp, blocks, last, output, id_base)| {
            let input = match blocks {
                0 => 0,
                n => 512 * (n as u64 - 1) + last,
            };
            let ids: Vec<String> = (0..blocks as u64).map(|i| (id_base + i).to_string()).collect();
            Line {
                text: format!(
                    r#"{{"timestamp": {timestamp}, "input_length": {input}, "output_length": {output}, "hash_ids": [{}]}}"#,
                    ids.join(", ")
                ),
                valid: Some(true),
            }
        },
    )
}

fn bad_line() -> impl Strategy<Value = Line> {
    let texts = prop_oneof![
        Just(r#"{"timestamp": 0, "input_length": 10, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 0.5, "input_length": 10, "output_length": 1, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": "0", "input_length": 10, "output_length": 1, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}"#.to_owned()),
        Just(r#"{"timestamp": 9223372036855, "input_length": 10, "output_length": 1, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 18446744073709551615, "input_length": 10, "output_length": 1, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 0, "input_length": 10, "output_length": 18446744073709551616, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 0, "input_length": 10, "output_length": 4294967296, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 0, "input_length": 10, "output_length": 18446744073709551615, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 0, "input_length": 18446744073709551615, "output_length": 1, "hash_ids": [1]}"#.to_owned()),
        Just(r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}"#.to_owned()),
        Just(r#"[1, 2, 3]"#.to_owned()),
        Just(r#"{"timestamp": 0"#.to_owned()),
        "[a-z{}\\[\\]:,\" ]{1,24}".prop_filter("not blank", |s| !s.trim().is_empty()),
    ];
    texts.prop_map(|text| Line {
        text,
        valid: Some(false),
    })
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        12 => valid_line(),
        1 => bad_line(),
        1 => Just(Line { text: "   ".to_owned(), valid: None }),
    ]
}

/// The 1-based line of the first bad line, if any.
fn first_bad(lines: &[Line]) -> Option<usize> {
    lines
        .iter()
        .position(|l| l.valid == Some(false))
        .map(|i| i + 1)
}

fn error_line(error: &SimError) -> Option<usize> {
    match error {
        SimError::MalformedLine { line, .. }
        | SimError::InconsistentRequest { line, .. }
        | SimError::OutputTooLong { line, .. }
        | SimError::TimestampTooLarge { line, .. } => Some(*line),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_traces_parse_or_name_their_first_bad_line(
        lines in prop::collection::vec(line(), 0..12),
        block_size in prop_oneof![Just(16usize), Just(64), Just(512), Just(48), Just(0)],
        capacity in prop_oneof![Just(Capacity::Unbounded), (0u64..40).prop_map(Capacity::Blocks)],
    ) {
        let text: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        let parsed = Trace::from_jsonl(&text.join("\n"));
        let trace = match (parsed, first_bad(&lines)) {
            (Err(error), Some(bad)) => {
                prop_assert_eq!(error_line(&error), Some(bad), "{}", error);
                prop_assert!(error.to_string().contains(&format!("line {bad}")), "{}", error);
                return Ok(());
            }
            (Err(SimError::EmptyTrace), None) => {
                prop_assert!(lines.iter().all(|l| l.valid.is_none()));
                return Ok(());
            }
            (Err(error), None) => return Err(TestCaseError::fail(format!("refused a good trace: {error}"))),
            (Ok(_), Some(bad)) => return Err(TestCaseError::fail(format!("accepted bad line {bad}"))),
            (Ok(trace), None) => trace,
        };
        let summary = trace.summary();
        prop_assert_eq!(summary.requests, trace.len() as u64);

        // Cache mode: any block size and capacity is a pool or a typed error.
        match Workload::new(&trace, block_size) {
            Ok(workload) => match CacheConfig::new(capacity, Eviction::Lru).run(&workload) {
                Ok(report) => {
                    prop_assert!(report.hits.hit_tokens <= report.hits.input_tokens);
                    prop_assert!(report.hits.hit_blocks <= report.hits.input_blocks);
                    prop_assert_eq!(report.hits.requests, trace.len() as u64);
                }
                Err(error) => prop_assert!(
                    matches!(error, SimError::ZeroCapacity { .. }),
                    "{}", error
                ),
            },
            Err(error) => prop_assert!(
                matches!(error, SimError::InvalidBlockSize { .. }),
                "{}", error
            ),
        }

        // Serve mode, on the requests with small outputs (a u32::MAX output
        // is valid but would decode until it outgrows the pool).
        let small: Vec<_> = trace.requests().iter().filter(|r| r.output_length < 8).cloned().collect();
        if let Ok(small) = Trace::from_requests(small) {
            let config = ServeConfig::new(16, Capacity::Tokens(4096)).with_audit_every(1);
            let report = config.run(&small).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(report.census.is_balanced());
            prop_assert_eq!(report.requests.len(), small.len());
            prop_assert!(report.hits.hit_tokens <= report.hits.input_tokens);
            // However late it arrived, a finished request that emitted a
            // token has its time to first token.
            prop_assert!(report
                .requests
                .iter()
                .filter(|r| r.outcome == ServeOutcome::Finished && r.output_tokens >= 1)
                .all(|r| r.ttft().is_some() && r.first_token >= Some(r.arrival)));
        }
    }
}
