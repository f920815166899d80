//! Onboarding for a model of several KV cache groups: the hit is the
//! longest prefix every group can serve from the device and the tiers
//! below together, and each group loads only the blocks it needs for that
//! hit and the device lacks (a sliding window only those its window reads,
//! which are not a prefix of the group's blocks).

use std::ops::Range;

use kvbm_blocks::{ImmutableBlocks, SequenceHash};

use super::onboard::Onboarding;
use super::{InferenceRequest, Parked, RequestKv, Scheduler};
use crate::Admitted;

impl<M> Scheduler<M> {
    /// [`try_onboard`](Self::try_onboard) for a request with KV cache
    /// groups. While it waits it holds nothing in its sequence: the device
    /// blocks its hit needs are pinned beside its loads, and once they land
    /// the sequence matches its prefix again (and finds them).
    #[allow(clippy::result_large_err)]
    pub(super) fn try_onboard_groups(
        &mut self,
        admitted: Admitted<InferenceRequest>,
        mut parked: Parked<M>,
    ) -> Result<usize, (Admitted<InferenceRequest>, Parked<M>)> {
        let room = self.onboarding_room();
        let Some(plan) = self.plan_group_loads(&parked.seq, room) else {
            return Err((admitted, parked));
        };
        let Some(tiers) = &mut self.tiers else {
            return Err((admitted, parked));
        };
        // What the device has of the hit's blocks stays pinned while the
        // loads' allocations evict: one match per run.
        let mut pins: Vec<ImmutableBlocks<M>> = Vec::new();
        for run in &plan.pin {
            pins.push(self.manager.match_blocks(run));
        }
        // Idle and holding only its matched prefix: cannot fail.
        let _ = parked.seq.release();
        // Every group's blocks in one walk: one transfer per source tier,
        // as for a request of one group.
        let onboard = tiers.onboard(&plan.to_load, room);
        if onboard.blocks == 0 {
            // Nothing could be planned (no room on the device): it starts
            // from what the device has, as without tiers.
            drop(pins);
            let _ = parked.seq.match_and_add_prefix(&self.manager);
            return Err((admitted, parked));
        }
        let waiting = Onboarding {
            admitted,
            parked,
            waits: onboard.transfers,
            loaded: pins,
            since: self.next_step,
            blocks: onboard.blocks,
        };
        Ok(self.wait_for_loads(waiting, &onboard.loaded_from))
    }

    /// The loads that extend `seq`'s hit past what the device serves, if
    /// the tiers below make it longer, they fit in `room` blocks and the
    /// cost model (if any) says they beat recomputing.
    fn plan_group_loads(&mut self, seq: &RequestKv<M>, room: usize) -> Option<GroupLoads> {
        let RequestKv::Groups(grouped) = seq else {
            return None;
        };
        let tiers = self.tiers.as_ref()?;
        let groups = grouped.groups();
        let block_size = groups.block_size();
        // Never the block of the last prompt token: it is always computed.
        let cap = grouped.total_tokens().saturating_sub(1) / block_size;
        let device_hit = grouped.kv_position() / block_size;
        if cap <= device_hit || room == 0 {
            return None;
        }
        let hashes: Vec<&[SequenceHash]> = (grouped.sequences().iter())
            .map(|group| {
                let all = group.inner().sequence().sequence_hashes();
                &all[..cap.min(all.len())]
            })
            .collect();
        let on_device: Vec<Vec<bool>> = (hashes.iter())
            .map(|hashes| self.manager.scan_matches(hashes))
            .collect();
        let below: Vec<Vec<bool>> = hashes.iter().map(|hashes| tiers.holds(hashes)).collect();
        let present = |flags: &[Vec<bool>], g: usize, i: usize| {
            flags
                .get(g)
                .and_then(|f| f.get(i))
                .copied()
                .unwrap_or(false)
        };
        let hit = groups.longest_common_hit_by(cap, |g, i| {
            present(&on_device, g, i) || present(&below, g, i)
        });
        if hit <= device_hit {
            return None;
        }
        let mut plan = GroupLoads::default();
        for (g, group) in groups.groups().iter().enumerate() {
            let needed = group.kind().needed_for_hit(hit, block_size);
            plan.to_load.extend(
                (needed.clone())
                    .filter(|&i| !present(&on_device, g, i))
                    .filter_map(|i| hashes[g].get(i).copied()),
            );
            for run in runs_of(&on_device[g], needed) {
                plan.pin.extend(hashes[g].get(run).map(<[_]>::to_vec));
            }
        }
        let loads = plan.to_load.len();
        // Per tier level, as one walk over every group's blocks finds them.
        let found = tiers.lookup(&plan.to_load);
        if loads == 0 || loads > room || found.iter().sum::<usize>() < loads {
            return None;
        }
        if let Some(cost) = &self.tiers_config.cost {
            let tokens = (hit - device_hit).saturating_mul(block_size);
            if !cost.beats_recomputing(&found, tokens) {
                self.onboard_stats.declined += 1;
                return None;
            }
        }
        Some(plan)
    }
}

/// One grouped request's onboarding, planned.
#[derive(Default)]
struct GroupLoads {
    /// Runs of consecutive blocks the hit needs that the device has (each
    /// pinned by one match).
    pin: Vec<Vec<SequenceHash>>,
    /// The hashes the hit needs that only the tiers below have, group by
    /// group.
    to_load: Vec<SequenceHash>,
}

/// The maximal runs of `flags` set within `within`.
fn runs_of(flags: &[bool], within: Range<usize>) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = None;
    for i in within.clone() {
        match (flags.get(i).copied().unwrap_or(false), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push(s..within.end);
    }
    runs
}
