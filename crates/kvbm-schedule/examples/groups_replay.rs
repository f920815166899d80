//! Replays requests one after another through a [`GroupedSequence`] of a
//! full-attention group and a sliding-window group, printing what vLLM's
//! `KVCacheManager` would be asked about: each request's prefix-cache hit,
//! the blocks each group holds once its prefill is allocated and once its
//! decodes are, and the blocks in use. `xtask/interop/check_vllm_groups.py`
//! runs the same workload through vLLM 0.33's own manager and compares.
//!
//! Input (a file named by the first argument): a line `block_size
//! num_blocks window`, then one line per request: the number of decode
//! steps, then the prompt's tokens. Output: one line per request, `hit
//! prefill_full prefill_window decode_full decode_window in_use`.
#![allow(clippy::print_stdout)] // an example's job is to print

use std::error::Error;
use std::sync::Arc;

use kvbm_blocks::BlockManager;
use kvbm_schedule::GroupedSequence;
use kvbm_sequence::{AttentionKind, KvCacheGroup, KvCacheGroups};

struct Gpu;

fn numbers(line: &str) -> Result<Vec<usize>, Box<dyn Error>> {
    Ok(line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?)
}

fn main() -> Result<(), Box<dyn Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: groups_replay WORKLOAD")?;
    let text = std::fs::read_to_string(path)?;
    let mut lines = text.lines();
    let head = numbers(lines.next().ok_or("empty workload")?)?;
    let [block_size, num_blocks, window] = head[..] else {
        return Err("the first line is `block_size num_blocks window`".into());
    };
    let groups = Arc::new(KvCacheGroups::new(
        block_size,
        vec![
            KvCacheGroup::new(AttentionKind::Full, 1),
            KvCacheGroup::new(AttentionKind::SlidingWindow { window }, 1),
        ],
    )?);
    let pool = BlockManager::<Gpu>::builder()
        .block_count(num_blocks)
        .block_size(block_size)
        .build()?;
    let held = |seq: &GroupedSequence<Gpu>, g: usize| seq.group(g).map_or(0, |s| s.held_blocks());
    let in_use = || pool.total_blocks() - pool.available_blocks();
    for line in lines {
        let request = numbers(line)?;
        let (&decodes, prompt) = request.split_first().ok_or("an empty request line")?;
        let tokens = prompt
            .iter()
            .map(|&t| u32::try_from(t))
            .collect::<Result<_, _>>()?;
        let decodes = decodes.max(1);
        let mut seq = GroupedSequence::<Gpu>::new(tokens, decodes + 1, groups.clone())?;
        let hit = seq.match_and_add_prefix(&pool)? * block_size;
        seq.schedule_prefill(seq.remaining_prefill_tokens(), &pool)?;
        let (prefill_full, prefill_window, used) = (held(&seq, 0), held(&seq, 1), in_use());
        seq.apply_prefill(Some(7), &pool)?;
        // vLLM appends a token and allocates its slot `decodes` times; here
        // the prefill sampled the first token, so the last decode is
        // scheduled (its slot allocated, as vLLM's last `allocate_slots`)
        // and measured, not applied.
        for _ in 1..decodes {
            seq.schedule_decode(&pool)?;
            seq.apply_decode(7, &pool)?;
        }
        seq.schedule_decode(&pool)?;
        let (decode_full, decode_window) = (held(&seq, 0), held(&seq, 1));
        seq.revert_schedule()?;
        println!("{hit} {prefill_full} {prefill_window} {decode_full} {decode_window} {used}");
    }
    Ok(())
}
