//! Parsing and checking Mooncake JSONL.

use super::*;

fn line(timestamp: u64, input_length: u64, hash_ids: &[u64]) -> String {
    format!(
        r#"{{"timestamp": {timestamp}, "input_length": {input_length}, "output_length": 7, "hash_ids": {hash_ids:?}}}"#
    )
}

#[test]
fn the_excerpt_is_the_first_500_conversation_requests() {
    let trace = Trace::conversation_excerpt().unwrap();
    assert_eq!(trace.len(), 500);
    let summary = trace.summary();
    // Independent numbers, from the fixture's PROVENANCE.md.
    assert_eq!(summary.input_tokens, 7_124_855);
    assert_eq!(summary.trace_blocks, 14_162);
    assert_eq!(summary.duration_ms, 165_000);
    let first = &trace.requests()[0];
    assert_eq!(
        (first.timestamp, first.input_length, first.output_length),
        (0, 6758, 500)
    );
    assert_eq!(first.hash_ids, (0..14).collect::<Vec<u64>>());
}

#[test]
fn blank_lines_are_skipped_but_counted() {
    let text = format!("{}\n\n   \n{}\n", line(0, 10, &[1]), line(5, 600, &[1, 2]));
    let trace = Trace::from_jsonl(&text).unwrap();
    assert_eq!(trace.len(), 2);
    let text = format!("{}\n\n{{\"timestamp\": 1,\n", line(0, 10, &[1]));
    match Trace::from_jsonl(&text) {
        Err(SimError::MalformedLine { line, .. }) => assert_eq!(line, 3),
        other => panic!("expected a malformed line 3, got {other:?}"),
    }
}

#[test]
fn malformed_lines_name_their_line_column_and_reason() {
    let text = format!(
        "{}\n{}\n{{\"timestamp\": 3, \"input_length\": 5, \"output_length\": 1}}\n",
        line(0, 10, &[1]),
        line(1, 10, &[1])
    );
    let err = Trace::from_jsonl(&text).unwrap_err();
    let SimError::MalformedLine {
        line,
        column,
        ref reason,
    } = err
    else {
        panic!("expected MalformedLine, got {err:?}");
    };
    assert_eq!(line, 3);
    assert!(column > 0);
    assert_eq!(reason, "missing field `hash_ids`");
    assert_eq!(
        err.to_string(),
        format!("malformed trace line 3, column {column}: missing field `hash_ids`")
    );

    for bad in [
        "not json",
        r#"{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}"#,
        r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}"#,
        r#"[1, 2, 3]"#,
    ] {
        assert!(
            matches!(
                Trace::from_jsonl(bad),
                Err(SimError::MalformedLine { line: 1, .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn unknown_fields_are_ignored() {
    let text = r#"{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [9], "priority": 2}"#;
    assert_eq!(Trace::from_jsonl(text).unwrap().requests()[0].hash_ids, [9]);
}

#[test]
fn hash_ids_must_cover_the_input_length() {
    let ok = |input, ids: &[u64]| Trace::from_jsonl(&line(0, input, ids)).is_ok();
    assert!(ok(1, &[1]));
    assert!(ok(512, &[1]));
    assert!(ok(513, &[1, 2]));
    assert!(ok(1024, &[1, 2]));
    assert!(ok(0, &[]));
    for (input, ids) in [(513, &[1][..]), (512, &[1, 2]), (0, &[1]), (5, &[])] {
        match Trace::from_jsonl(&line(0, input, ids)) {
            Err(SimError::InconsistentRequest {
                line: 1,
                input_length,
                blocks,
            }) => assert_eq!((input_length, blocks), (input, ids.len())),
            other => panic!("{input} tokens in {ids:?}: {other:?}"),
        }
    }
}

#[test]
fn empty_traces_are_refused() {
    assert!(matches!(Trace::from_jsonl(""), Err(SimError::EmptyTrace)));
    assert!(matches!(
        Trace::from_jsonl("\n  \n"),
        Err(SimError::EmptyTrace)
    ));
    assert!(matches!(
        Trace::from_requests(Vec::new()),
        Err(SimError::EmptyTrace)
    ));
}

#[test]
fn in_memory_requests_are_checked_by_index() {
    let good = TraceRequest {
        timestamp: 0,
        input_length: 600,
        output_length: 1,
        hash_ids: vec![1, 2],
        priority: None,
    };
    let bad = TraceRequest {
        input_length: 2000,
        ..good.clone()
    };
    let trace = Trace::from_requests(vec![good.clone()]).unwrap();
    assert_eq!(trace.requests(), std::slice::from_ref(&good));
    assert!(matches!(
        Trace::from_requests(vec![good, bad]),
        Err(SimError::InconsistentRequest { line: 2, .. })
    ));
}

#[test]
fn files_that_are_missing_or_unreadable() {
    let missing = std::env::temp_dir().join("kvbm-sim-no-such-trace.jsonl");
    match Trace::from_path(&missing) {
        Err(SimError::TraceNotFound { path }) => assert_eq!(path, missing),
        other => panic!("{other:?}"),
    }
    // A directory exists but is not a readable file.
    assert!(matches!(
        Trace::from_path(std::env::temp_dir()),
        Err(SimError::ReadTrace { .. })
    ));
}

#[test]
fn progress_sees_every_byte_once() {
    #[derive(Default)]
    struct Count {
        total: u64,
        seen: u64,
        phases: u32,
    }
    impl Progress for Count {
        fn start(&mut self, _label: &str, total: u64) {
            self.total = total;
            self.phases += 1;
        }
        fn advance(&mut self, amount: u64) {
            self.seen += amount;
        }
        fn finish(&mut self) {}
    }
    let mut count = Count::default();
    let trace = Trace::parse(CONVERSATION_EXCERPT, &mut count).unwrap();
    assert_eq!(trace.len(), 500);
    assert_eq!(count.phases, 1);
    assert_eq!(count.total, CONVERSATION_EXCERPT.len() as u64);
    assert_eq!(count.seen, count.total);
}

/// Issue 11, defect 9: an absurd `output_length` used to overflow the
/// summary's u64 sums (a panic in debug); it is refused, naming the line.
#[test]
fn an_absurd_output_length_is_refused_with_its_line() {
    let line = |output: u64| {
        format!(
            r#"{{"timestamp": 0, "input_length": 10, "output_length": {output}, "hash_ids": [1]}}"#
        )
    };
    let text = [line(5), line(u64::MAX), line(u64::MAX)].join("\n");
    assert!(matches!(
        Trace::from_jsonl(&text),
        Err(SimError::OutputTooLong {
            line: 2,
            output_length: u64::MAX
        })
    ));
    let largest =
        Trace::from_jsonl(&[line(u64::from(u32::MAX)), line(u64::from(u32::MAX))].join("\n"))
            .unwrap();
    assert_eq!(largest.summary().output_tokens, 2 * u64::from(u32::MAX));
    assert!(matches!(
        Trace::from_jsonl(&line(u64::from(u32::MAX) + 1)),
        Err(SimError::OutputTooLong { line: 1, .. })
    ));
}

#[test]
fn a_line_may_carry_a_vllm_priority() {
    let trace = Trace::from_jsonl(
        "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1], \"priority\": -2}\n\
         {\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let priorities: Vec<Option<i64>> = trace.requests().iter().map(|r| r.priority).collect();
    assert_eq!(priorities, [Some(-2), None]);
    // Written back without a priority it did not have.
    let json = serde_json::to_string(&trace.requests()[1]).unwrap();
    assert!(!json.contains("priority"), "{json}");
}

#[test]
fn timestamps_past_the_clock_are_refused_naming_their_line() {
    // The largest timestamp the clock follows, and one millisecond more.
    assert_eq!(MAX_TIMESTAMP_MS, 9_223_372_036_854);
    assert_eq!(
        arrival_nanos(MAX_TIMESTAMP_MS),
        Some(9_223_372_036_854_000_000)
    );
    assert_eq!(arrival_nanos(MAX_TIMESTAMP_MS + 1), None);
    let text = format!(
        "{}\n\n{}\n",
        line(0, 10, &[1]),
        line(MAX_TIMESTAMP_MS, 10, &[1])
    );
    let trace = Trace::from_jsonl(&text).unwrap();
    assert_eq!(trace.summary().duration_ms, MAX_TIMESTAMP_MS);
    for timestamp in [MAX_TIMESTAMP_MS + 1, u64::MAX] {
        // Line 3: the blank line counts.
        let text = format!("{}\n\n{}\n", line(0, 10, &[1]), line(timestamp, 10, &[1]));
        let err = Trace::from_jsonl(&text).unwrap_err();
        assert!(
            matches!(err, SimError::TimestampTooLarge { line: 3, timestamp: t } if t == timestamp),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "trace line 3: timestamp {timestamp} ms exceeds the maximum of 9223372036854 ms \
                 (about 292 years)"
            )
        );
    }
    // In-memory requests are checked the same way, by 1-based index.
    let request = |timestamp| TraceRequest {
        timestamp,
        input_length: 10,
        output_length: 1,
        hash_ids: vec![1],
        priority: None,
    };
    assert!(matches!(
        Trace::from_requests(vec![request(0), request(u64::MAX)]),
        Err(SimError::TimestampTooLarge { line: 2, .. })
    ));
}

#[test]
fn copies_arrive_together_in_the_trace_order_with_ids_of_their_own() {
    // Out of timestamp order on purpose: the copies keep file order.
    let text = format!("{}\n{}\n", line(500, 600, &[7, 9]), line(300, 100, &[3]));
    let mut trace = Trace::from_jsonl(&text).unwrap();
    trace.requests[1].priority = Some(-2);
    let copies = trace.replicate(3).unwrap();
    let shape: Vec<(u64, u64, &[u64], Option<i64>)> = (copies.requests().iter())
        .map(|r| {
            (
                r.timestamp,
                r.input_length,
                r.hash_ids.as_slice(),
                r.priority,
            )
        })
        .collect();
    // The largest id is 9: copy k adds 10 k.
    assert_eq!(
        shape,
        [
            (500, 600, &[7, 9][..], None),
            (500, 600, &[17, 19], None),
            (500, 600, &[27, 29], None),
            (300, 100, &[3], Some(-2)),
            (300, 100, &[13], Some(-2)),
            (300, 100, &[23], Some(-2)),
        ]
    );
    let (one, three) = (trace.summary(), copies.summary());
    assert_eq!(three.requests, 3 * one.requests);
    assert_eq!(three.input_tokens, 3 * one.input_tokens);
    assert_eq!(three.duration_ms, one.duration_ms);
    // Copies of copies are still told apart.
    let nine = copies.replicate(3).unwrap();
    let mut ids: Vec<u64> = (nine.requests().iter())
        .flat_map(|r| r.hash_ids.iter().copied())
        .collect();
    let all = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), all);
}
