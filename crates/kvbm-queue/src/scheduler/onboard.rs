//! Onboarding: an admitted request whose prefix a lower tier holds waits in
//! a state of its own, holding device blocks, while the engine loads the
//! prefix; then it computes only the rest.

use kvbm_blocks::ImmutableBlocks;
use kvbm_tiers::{Outcome, Settled, TierConfig, TransferId};
use tracing::debug;

use super::{
    FinishReason, Finished, InferenceRequest, Parked, RequestId, RequestKv, Scheduler, StepPlan,
};
use crate::{Admitted, SchedulerError};

/// How a [`Scheduler`] uses tiers below the device
/// ([`Scheduler::with_tiers`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TiersConfig {
    /// The lower tiers, in order (the first right below the device).
    pub lower: Vec<TierConfig>,
    /// Most blocks being onboarded at once, over all requests (default
    /// 4,096): a request whose prefix would take more loads only what fits
    /// and recomputes the rest.
    pub max_onboarding_blocks: usize,
    /// Steps a request waits for its loads (default 256); past them it
    /// stops waiting, the loads still in flight are abandoned (their result
    /// is thrown away when the engine reports them) and it recomputes what
    /// did not arrive.
    pub load_timeout_steps: u64,
    /// When loading beats recomputing; `None` (the default) always loads.
    pub cost: Option<LoadCost>,
}

/// No lower tier, with the defaults: what a [`Scheduler`] without
/// [`with_tiers`](Scheduler::with_tiers) runs with.
///
/// ```
/// use kvbm_queue::TiersConfig;
///
/// assert!(TiersConfig::default().lower.is_empty());
/// assert_eq!(TiersConfig::default(), TiersConfig::new(Vec::new()));
/// ```
impl Default for TiersConfig {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl TiersConfig {
    /// `lower` with the defaults.
    pub fn new(lower: Vec<TierConfig>) -> Self {
        Self {
            lower,
            max_onboarding_blocks: 4096,
            load_timeout_steps: 256,
            cost: None,
        }
    }

    /// Sets [`max_onboarding_blocks`](Self::max_onboarding_blocks).
    pub fn with_max_onboarding_blocks(mut self, blocks: usize) -> Self {
        self.max_onboarding_blocks = blocks;
        self
    }

    /// Sets [`load_timeout_steps`](Self::load_timeout_steps).
    pub fn with_load_timeout_steps(mut self, steps: u64) -> Self {
        self.load_timeout_steps = steps;
        self
    }

    /// Sets [`cost`](Self::cost).
    pub fn with_cost(mut self, cost: LoadCost) -> Self {
        self.cost = Some(cost);
        self
    }

    pub(super) fn validate(&self) -> Result<(), SchedulerError> {
        if self.max_onboarding_blocks == 0 {
            return Err(SchedulerError::ZeroLimit {
                field: "max_onboarding_blocks",
            });
        }
        if let Some(cost) = &self.cost {
            cost.validate(self.lower.len())?;
        }
        Ok(())
    }
}

/// The cost model onboarding is chosen by: a prefix is loaded only if
/// loading it takes less time than recomputing it, so a slow tier never
/// makes time to first token worse than having no tier.
///
/// Loads from different tiers run in parallel (each tier has its own
/// link), a tier's blocks one after another: loading takes the longest of
/// `setup_s + blocks × block_s` over the tiers involved. Recomputing takes
/// `tokens × recompute_token_s`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LoadCost {
    /// Seconds to compute one prompt token's KV.
    pub recompute_token_s: f64,
    /// Per lower tier, in order: what one load from it costs.
    pub links: Vec<LinkCost>,
}

/// What loading from one tier costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Seconds per transfer, whatever its size (the link's setup time).
    pub setup_s: f64,
    /// Seconds per block (its bytes over the link's bandwidth).
    pub block_s: f64,
}

impl LoadCost {
    /// A model with `links` (one per lower tier) and `recompute_token_s`.
    pub fn new(recompute_token_s: f64, links: Vec<LinkCost>) -> Self {
        Self {
            recompute_token_s,
            links,
        }
    }

    /// Whether loading `found` blocks per tier level (as
    /// `kvbm_tiers::Tiers::lookup` counts them; level 0, blocks already
    /// on their way, costs nothing more) beats recomputing them.
    pub fn worth_loading(&self, found: &[usize], block_size: usize) -> bool {
        let blocks: usize = found.iter().sum();
        self.beats_recomputing(found, blocks.saturating_mul(block_size))
    }

    /// Whether loading `found` blocks per tier level (as
    /// [`worth_loading`](Self::worth_loading)) beats recomputing `tokens`
    /// tokens: for a model of several KV cache groups, whose groups load
    /// blocks for the same tokens.
    pub fn beats_recomputing(&self, found: &[usize], tokens: usize) -> bool {
        let recompute = tokens as f64 * self.recompute_token_s;
        let load = (found.iter().enumerate().skip(1))
            .filter(|&(_, &n)| n > 0)
            .map(|(level, &n)| {
                self.links
                    .get(level - 1)
                    .map_or(f64::INFINITY, |link| link.setup_s + n as f64 * link.block_s)
            })
            .fold(0.0, f64::max);
        load < recompute
    }

    fn validate(&self, tiers: usize) -> Result<(), SchedulerError> {
        let bad = |name: &'static str, value: f64| SchedulerError::InvalidCost {
            name,
            value: value.to_string(),
        };
        if !(self.recompute_token_s.is_finite() && self.recompute_token_s >= 0.0) {
            return Err(bad("recompute_token_s", self.recompute_token_s));
        }
        if self.links.len() != tiers {
            return Err(SchedulerError::InvalidCost {
                name: "links (one per lower tier)",
                value: self.links.len().to_string(),
            });
        }
        for link in &self.links {
            for (name, value) in [("setup_s", link.setup_s), ("block_s", link.block_s)] {
                if !(value.is_finite() && value >= 0.0) {
                    return Err(bad(name, value));
                }
            }
        }
        Ok(())
    }
}

/// A request waiting for its prefix to be loaded.
pub(super) struct Onboarding<M> {
    pub(super) admitted: Admitted<InferenceRequest>,
    /// Its sequence, holding the prefix that was on the device.
    pub(super) parked: Parked<M>,
    /// Transfers not settled yet.
    pub(super) waits: Vec<TransferId>,
    /// Blocks of completed loads, pinned on the device until it starts.
    pub(super) loaded: Vec<ImmutableBlocks<M>>,
    /// The step it began waiting.
    pub(super) since: u64,
    /// Blocks it onboards (counted against `max_onboarding_blocks`).
    pub(super) blocks: usize,
}

/// What onboarding has done, counted since the scheduler was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OnboardStats {
    /// Requests that waited for loads.
    pub requests: u64,
    /// Blocks they waited for (loads planned for them, or already under way).
    pub blocks: u64,
    /// Blocks planned for loading, per lower tier level (`[k]`: tier `k`;
    /// `[0]` unused).
    pub loaded_from: [u64; 8],
    /// Requests that stopped waiting at the timeout.
    pub timeouts: u64,
    /// Steps requests waited, summed (the mean stall is this over
    /// `requests`).
    pub stall_steps: u64,
    /// Requests whose prefix a lower tier held but the cost model chose to
    /// recompute.
    pub declined: u64,
}

impl<M> Scheduler<M> {
    /// Tries to onboard a candidate whose device prefix is matched: if the
    /// tiers below hold more of its prefix, the cost model says loading
    /// beats recomputing, and the onboarding cap has room, it waits for the
    /// loads (`Ok` with the device blocks allocated for them); otherwise it
    /// comes back to be started as usual.
    #[allow(clippy::result_large_err)]
    pub(super) fn try_onboard(
        &mut self,
        admitted: Admitted<InferenceRequest>,
        parked: Parked<M>,
    ) -> Result<usize, (Admitted<InferenceRequest>, Parked<M>)> {
        if matches!(parked.seq, RequestKv::Groups(_)) {
            return self.try_onboard_groups(admitted, parked);
        }
        let room = self.onboarding_room();
        let Some(tiers) = &mut self.tiers else {
            return Err((admitted, parked));
        };
        let block_size = self.manager.block_size();
        let seq = &parked.seq;
        // Never the block of the last prompt token: it is always computed.
        let most = seq.total_tokens().saturating_sub(1) / block_size;
        let held = seq.held_blocks();
        let hashes = seq.inner().sequence().sequence_hashes();
        let wanted = hashes.get(held..most.max(held)).unwrap_or_default();
        if wanted.is_empty() || room == 0 {
            return Err((admitted, parked));
        }
        let found = tiers.lookup(wanted);
        if found.iter().sum::<usize>() == 0 {
            return Err((admitted, parked));
        }
        if let Some(cost) = &self.tiers_config.cost
            && !cost.worth_loading(&found, block_size)
        {
            self.onboard_stats.declined += 1;
            return Err((admitted, parked));
        }
        let onboard = tiers.onboard(wanted, room);
        if onboard.blocks == 0 {
            return Err((admitted, parked));
        }
        let waiting = Onboarding {
            admitted,
            parked,
            waits: onboard.transfers,
            loaded: Vec::new(),
            since: self.next_step,
            blocks: onboard.blocks,
        };
        Ok(self.wait_for_loads(waiting, &onboard.loaded_from))
    }

    /// Blocks more requests may onboard now under `max_onboarding_blocks`.
    pub(super) fn onboarding_room(&self) -> usize {
        let onboarding_blocks: usize = self.onboarding.iter().map(|o| o.blocks).sum();
        (self.tiers_config.max_onboarding_blocks).saturating_sub(onboarding_blocks)
    }

    /// Counts a request's onboarding (`loaded_from`: the blocks its loads
    /// bring up, per tier level) and has it wait; the blocks it loads.
    pub(super) fn wait_for_loads(
        &mut self,
        waiting: Onboarding<M>,
        loaded_from: &[usize],
    ) -> usize {
        let loading: usize = loaded_from.iter().sum();
        self.onboard_stats.requests += 1;
        self.onboard_stats.blocks += waiting.blocks as u64;
        for (level, &n) in loaded_from.iter().enumerate() {
            if let Some(slot) = self.onboard_stats.loaded_from.get_mut(level) {
                *slot += n as u64;
            }
        }
        debug!(id = %waiting.admitted.id(), blocks = waiting.blocks, loading, "onboarding");
        self.onboarding.push(waiting);
        loading
    }

    /// Starts, in admission order, the onboarding requests whose loads are
    /// all settled, or that waited past the timeout (abandoning the loads
    /// no other request waits for). Each extends its device prefix with
    /// what was loaded and computes the rest; one that cannot start now
    /// goes back to its queue place (its loaded blocks stay cached).
    pub(super) fn start_onboarded(&mut self, budget: &mut usize, plan: &mut StepPlan) {
        let timeout = self.tiers_config.load_timeout_steps;
        let mut i = 0;
        while i < self.onboarding.len() {
            let waited = self.next_step.saturating_sub(self.onboarding[i].since);
            let timed_out = waited >= timeout && !self.onboarding[i].waits.is_empty();
            if !self.onboarding[i].waits.is_empty() && !timed_out {
                i += 1;
                continue;
            }
            if *budget == 0 {
                return;
            }
            let record = self.onboarding.remove(i);
            if timed_out {
                self.onboard_stats.timeouts += 1;
                self.abandon_waits(&record.waits);
            }
            self.onboard_stats.stall_steps += waited;
            let Onboarding {
                admitted,
                mut parked,
                loaded,
                ..
            } = record;
            // Once is enough: if it cannot start now, it recomputes later.
            parked.onboard = false;
            // Loaded blocks are registered on the device: the match finds
            // them (and anything else cached since).
            if let Err(err) = parked.seq.match_and_add_prefix(&self.manager) {
                debug!(id = %admitted.id(), %err, "onboarded prefix not matched");
            }
            drop(loaded);
            if self
                .start_seq(admitted, parked, budget, plan, false)
                .is_none()
            {
                // Back at its place; later ones wait for the next step too.
                return;
            }
        }
    }

    /// Abandons each transfer no other onboarding request waits for.
    fn abandon_waits(&mut self, waits: &[TransferId]) {
        let Some(tiers) = &mut self.tiers else {
            return;
        };
        for id in waits {
            let shared = (self.onboarding.iter()).any(|other| other.waits.contains(id));
            if !shared {
                // Unknown only if settled meanwhile: nothing to abandon.
                let _ = tiers.abandon(*id);
            }
        }
    }

    /// The engine's reports of transfers ([`StepPlan::transfers`]),
    /// completed or failed, all or nothing: completed loads register their
    /// blocks on the device and the requests waiting for them become ready;
    /// failed ones leave nothing behind and those requests recompute.
    /// Reports may come at any time, between steps or while a step runs.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Tier`] for a transfer that was never planned,
    /// already reported, or named twice in `reports`, or if the scheduler
    /// has no tiers; nothing changes then.
    pub fn report_transfers(
        &mut self,
        reports: &[(TransferId, Outcome)],
    ) -> Result<(), SchedulerError> {
        let Some(tiers) = &mut self.tiers else {
            return match reports.first() {
                None => Ok(()),
                Some(&(id, _)) => Err(kvbm_tiers::TierError::UnknownTransfer(id).into()),
            };
        };
        let settled = tiers.settle_all(reports)?;
        for settled in settled {
            let id = settled.id();
            let waiting = self.onboarding.iter_mut().filter(|o| o.waits.contains(&id));
            match &settled {
                Settled::Loaded { blocks, .. } => {
                    for record in waiting {
                        record.waits.retain(|w| *w != id);
                        record.loaded.push(blocks.clone());
                    }
                }
                _ => {
                    for record in waiting {
                        record.waits.retain(|w| *w != id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Transfers planned since the last [`step`](Self::step) (the stores of
    /// blocks the last `apply` registered), appended to `out`, for an engine
    /// that starts them at once rather than with the next step's plan
    /// (which lists whatever is still not taken). With nothing below the
    /// device there are none.
    pub fn take_transfers(&mut self, out: &mut Vec<kvbm_tiers::Transfer>) {
        if let Some(tiers) = &mut self.tiers {
            tiers.take_planned(out);
        }
    }

    /// Transfers planned and not yet reported.
    pub fn transfers_in_flight(&self) -> usize {
        self.tiers
            .as_ref()
            .map_or(0, kvbm_tiers::Tiers::in_flight_count)
    }

    /// Takes an onboarding request out (abort, cancel): its device blocks
    /// go back, its loads are abandoned unless another request waits for
    /// them, and its id retires.
    pub(super) fn take_out_onboarding(
        &mut self,
        id: RequestId,
        reason: FinishReason,
    ) -> Option<Finished> {
        let at = self.onboarding.iter().position(|o| o.admitted.id() == id)?;
        let record = self.onboarding.remove(at);
        self.abandon_waits(&record.waits);
        let generated = record.parked.seq.generated_tokens();
        debug!(%id, ?reason, "taken out while onboarding");
        Some(self.exit(id, reason, generated))
    }

    /// Offers the blocks `running[index]` registered from block index
    /// `registered_before` on (where its first group's registered blocks
    /// ended before the apply) to the tiers below (write-through,
    /// selective), in every group: groups register the same block indices
    /// in lock-step.
    pub(super) fn offload_new_blocks(&mut self, index: usize, registered_before: usize) {
        let Some(tiers) = &mut self.tiers else {
            return;
        };
        let Some(running) = self.running.get(index) else {
            return;
        };
        for group in running.seq.sequences() {
            let assignments = group.inner().assignments();
            let end = assignments.assigned_end();
            if end <= registered_before {
                continue;
            }
            let skipped = assignments.skipped_count();
            let held_from = registered_before.max(skipped);
            let held = (assignments.assigned()).clone_range(held_from - skipped..end - skipped);
            if registered_before >= skipped {
                tiers.offload_batch(held);
                continue;
            }
            // A window released some of them in the same apply: they are
            // cached on the device, found again by their hashes.
            let hashes = group.inner().sequence().sequence_hashes();
            let released = hashes.get(registered_before..skipped).unwrap_or_default();
            let mut new = self.manager.match_blocks(released);
            // Both are this pool's: never refused.
            let _ = new.append(held);
            tiers.offload_batch(new);
        }
    }
}
