//! Every way a user can get a run wrong gets a typed error, never a panic.

use kvbm_sim::{CacheConfig, Capacity, Eviction, SimError, SweepConfig, Trace, Workload, sweep};

use crate::Scratch;

#[test]
fn the_error_type_travels_between_threads() {
    fn is_error<E: std::error::Error + Send + Sync + 'static>() {}
    is_error::<SimError>();
}

#[test]
fn a_missing_trace_file() {
    let scratch = Scratch::new("missing");
    let path = scratch.0.join("nope.jsonl");
    let err = Trace::from_path(&path).unwrap_err();
    assert!(matches!(err, SimError::TraceNotFound { path: ref p } if *p == path));
    assert_eq!(
        err.to_string(),
        format!("trace file not found: {}", path.display())
    );
}

#[test]
fn a_malformed_line_names_its_line_number() {
    let scratch = Scratch::new("malformed");
    let good = r#"{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}"#;
    let path = scratch.file(
        "trace.jsonl",
        &format!("{good}\n{good}\n{good}\n{{\"timestamp\": 0, \"input_length\": 10,,}}\n{good}\n"),
    );
    let err = Trace::from_path(&path).unwrap_err();
    assert!(
        matches!(err, SimError::MalformedLine { line: 4, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("malformed trace line 4, column "),
        "{err}"
    );
}

#[test]
fn an_inconsistent_request_names_its_line_number() {
    let scratch = Scratch::new("inconsistent");
    let path = scratch.file(
        "trace.jsonl",
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n\
         {\"timestamp\": 0, \"input_length\": 9000, \"output_length\": 1, \"hash_ids\": [1]}\n",
    );
    let err = Trace::from_path(&path).unwrap_err();
    assert!(
        matches!(
            err,
            SimError::InconsistentRequest {
                line: 2,
                input_length: 9000,
                blocks: 1
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_zero_capacity() {
    let workload = Workload::new(&Trace::conversation_excerpt().unwrap(), 512).unwrap();
    for capacity in [
        Capacity::Blocks(0),
        Capacity::Tokens(0),
        Capacity::Tokens(100),
    ] {
        let err = CacheConfig::new(capacity, Eviction::Lru)
            .run(&workload)
            .unwrap_err();
        assert!(
            matches!(
                err,
                SimError::ZeroCapacity {
                    block_size: 512,
                    ..
                }
            ),
            "{capacity}: {err:?}"
        );
    }
    let err = CacheConfig::new(Capacity::Blocks(0), Eviction::Lru)
        .run(&workload)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cache capacity 0 blocks holds no 512-token block"
    );
    // A sweep fails on its bad capacity before replaying anything.
    let config = SweepConfig::new(
        vec![Capacity::Blocks(100), Capacity::Blocks(0)],
        vec![Eviction::Lru],
    );
    assert!(matches!(
        sweep(&workload, &config, &mut kvbm_sim::NoProgress),
        Err(SimError::ZeroCapacity { .. })
    ));
}

#[test]
fn a_block_size_that_does_not_divide_512() {
    let trace = Trace::conversation_excerpt().unwrap();
    for block_size in [0, 3, 100, 768, 1024] {
        let err = Workload::new(&trace, block_size).unwrap_err();
        assert!(
            matches!(err, SimError::InvalidBlockSize { block_size: b } if b == block_size),
            "{err:?}"
        );
    }
    assert_eq!(
        Workload::new(&trace, 3).unwrap_err().to_string(),
        "block size 3 must divide the trace's 512-token blocks (1, 2, 4, ..., 256, 512)"
    );
}

#[test]
fn an_empty_sweep() {
    let workload = Workload::new(&Trace::conversation_excerpt().unwrap(), 512).unwrap();
    for config in [
        SweepConfig::new(vec![], vec![Eviction::Lru]),
        SweepConfig::new(vec![Capacity::Blocks(10)], vec![]),
    ] {
        assert!(matches!(
            sweep(&workload, &config, &mut kvbm_sim::NoProgress),
            Err(SimError::EmptySweep)
        ));
    }
}

#[test]
fn an_unwritable_output_directory() {
    let scratch = Scratch::new("unwritable");
    // A file where the output directory should be.
    let blocker = scratch.file("out", "not a directory");
    let workload = Workload::new(&Trace::conversation_excerpt().unwrap(), 512).unwrap();
    let config = SweepConfig::new(vec![Capacity::Blocks(1000)], vec![Eviction::Lru]);
    let sweep = sweep(&workload, &config, &mut kvbm_sim::NoProgress).unwrap();
    match sweep.write_to(&blocker) {
        Err(SimError::WriteOutput { path, .. }) => assert_eq!(path, blocker),
        other => panic!("{other:?}"),
    }
}
