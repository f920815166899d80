//! Sweeps: the table and the plot over capacities and policies.

use kvbm_sim::{Capacity, Eviction, NoProgress, SweepConfig, Trace, Workload, sweep};

use crate::Scratch;

fn excerpt() -> Workload {
    Workload::new(&Trace::conversation_excerpt().unwrap(), 512).unwrap()
}

#[test]
fn a_sweep_runs_every_policy_at_every_capacity_once() {
    let workload = excerpt();
    let config = SweepConfig::new(
        // Unsorted, with a duplicate (2,048 blocks either way).
        vec![
            Capacity::Blocks(4000),
            Capacity::Blocks(1000),
            Capacity::Tokens(2048 * 512),
            Capacity::Blocks(2048),
        ],
        vec![Eviction::Lineage, Eviction::Lru, Eviction::Lru],
    );
    let sweep = sweep(&workload, &config, &mut NoProgress).unwrap();
    assert_eq!(sweep.capacities(), [1000, 2048, 4000]);
    assert_eq!(sweep.evictions(), [Eviction::Lru, Eviction::Lineage]);
    assert_eq!(sweep.runs.len(), 6);
    assert!(sweep.unbounded.unbounded);
    assert_eq!(sweep.unbounded.hits.hit_blocks, 2_283);
    for run in &sweep.runs {
        assert!(run.hits.hit_blocks <= sweep.unbounded.hits.hit_blocks);
        assert_eq!(run.hits.input_blocks, 14_162);
    }
    // More LRU cache never hurts on this trace.
    let lru: Vec<u64> = sweep
        .capacities()
        .into_iter()
        .map(|blocks| sweep.run(Eviction::Lru, blocks).unwrap().hits.hit_blocks)
        .collect();
    assert!(lru.windows(2).all(|pair| pair[0] <= pair[1]), "{lru:?}");
}

#[test]
fn the_table_and_plot_say_what_the_runs_say() {
    let workload = excerpt();
    let config = SweepConfig::new(
        vec![Capacity::Blocks(1000), Capacity::Blocks(4000)],
        Eviction::ALL.to_vec(),
    );
    let sweep = sweep(&workload, &config, &mut NoProgress).unwrap();

    let csv = sweep.to_csv();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 1 + 6 + 1);
    assert!(lines[0].starts_with("eviction,unbounded,block_size,capacity_blocks,"));
    let lru_1000 = sweep.run(Eviction::Lru, 1000).unwrap();
    assert!(lines[1].starts_with(&format!(
        "lru,false,512,1000,512000,500,14162,{},",
        lru_1000.hits.hit_blocks
    )));
    assert!(lines[7].starts_with("none,true,512,11879,"), "{}", lines[7]);

    let markdown = sweep.to_markdown();
    assert!(markdown.starts_with(
        "| capacity (blocks) | capacity (tokens) | lru | multi-level | lineage |\n|---:|---:|---:|---:|---:|\n| 1,000 | 512,000 |"
    ), "{markdown}");
    assert!(markdown.contains("| unbounded (11,879) | 6,082,048 | 16.12% | 16.12% | 16.12% |"));

    let svg = sweep.to_svg().unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
    assert!(svg.trim_end().ends_with("</svg>"));
    for label in [
        "lru",
        "multi-level",
        "lineage",
        "unbounded (16.12%)",
        "block hit rate (%)",
    ] {
        assert!(svg.contains(label), "{label}");
    }

    let scratch = Scratch::new("sweep");
    let out = scratch.0.join("nested/out");
    let files = sweep.write_to(&out).unwrap();
    assert_eq!(std::fs::read_to_string(&files.csv).unwrap(), csv);
    assert_eq!(std::fs::read_to_string(&files.markdown).unwrap(), markdown);
    assert_eq!(std::fs::read_to_string(&files.svg).unwrap(), svg);
}
