//! Buffers of sent batches, kept for the next ones.

use super::CacheEvent;
use crate::SequenceHash;

/// Emptied buffers of batches every subscriber dropped, for new runs. A
/// subscriber that keeps up then costs no allocation per batch.
#[derive(Default)]
pub(super) struct Spares {
    hashes: Vec<Vec<SequenceHash>>,
    tokens: Vec<Vec<u32>>,
}

/// Spare buffers kept per kind, and the largest kept: enough for a batch of
/// a busy step, small enough that the spares stay a few hundred KiB.
const MAX_SPARES: usize = 64;
const MAX_SPARE_LEN: usize = 4_096;

impl Spares {
    /// Takes apart a batch's events, keeping their buffers.
    pub(super) fn reclaim(&mut self, events: &mut Vec<CacheEvent>) {
        for event in events.drain(..) {
            match event {
                CacheEvent::Stored { hashes, tokens } => {
                    keep(&mut self.hashes, hashes);
                    keep(&mut self.tokens, tokens);
                }
                CacheEvent::Removed { hashes } => keep(&mut self.hashes, hashes),
                CacheEvent::Cleared => {}
            }
        }
    }

    pub(super) fn hashes(&mut self, capacity: usize) -> Vec<SequenceHash> {
        take(&mut self.hashes, capacity)
    }

    pub(super) fn tokens(&mut self, capacity: usize) -> Vec<u32> {
        match capacity {
            0 => Vec::new(),
            _ => take(&mut self.tokens, capacity),
        }
    }
}

fn keep<T>(spares: &mut Vec<Vec<T>>, mut buffer: Vec<T>) {
    if spares.len() < MAX_SPARES && (1..=MAX_SPARE_LEN).contains(&buffer.capacity()) {
        buffer.clear();
        spares.push(buffer);
    }
}

/// A spare with room for `capacity`, or a new buffer (growing a spare
/// would copy it for nothing).
fn take<T>(spares: &mut Vec<Vec<T>>, capacity: usize) -> Vec<T> {
    match spares.last() {
        Some(spare) if spare.capacity() >= capacity => spares.pop().unwrap_or_default(),
        _ => Vec::with_capacity(capacity),
    }
}
