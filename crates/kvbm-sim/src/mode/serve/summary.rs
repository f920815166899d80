//! The report of a finished replay, assembled from the engine's records of
//! each request, its counters, the scheduler's census and the tiers'
//! statistics.

use std::time::Duration;

use super::kv::KvPeaks;
use super::report::{self, AdmissionStats, RequestTimeline, ServeReport};
use super::tier_report::{OnboardFigures, TierFigures, TierReport};
use super::transfers::EngineTransfers;
use super::{NEVER, ServeSim};
use crate::{HitStats, SimError};

impl ServeSim<'_> {
    /// The trace indices of [`report`](Self::report)'s requests, in its
    /// order: every trace request for serve mode's engine, the requests
    /// routed to it, as they were, for a cluster's.
    pub(crate) fn request_indices(&self) -> Vec<usize> {
        self.tracks.indices()
    }

    /// The report of a finished replay (replay time left at zero): a
    /// timeline per request the engine knows
    /// ([`request_indices`](Self::request_indices)).
    pub(crate) fn report(&self, capacity_blocks: usize) -> Result<ServeReport, SimError> {
        let census = self.scheduler.audit()?;
        let block_size = self.scheduler.manager().block_size();
        let requests = self.trace.requests();
        let mut hits = HitStats::default();
        let mut timelines = Vec::with_capacity(self.tracks.len());
        for (index, track) in self.tracks.iter() {
            let Some(request) = requests.get(index) else {
                continue;
            };
            let at = |nanos: u64| (nanos != NEVER).then(|| Duration::from_nanos(nanos));
            let timeline = RequestTimeline {
                arrival: Duration::from_nanos(track.arrival),
                admitted: at(track.admitted),
                first_token: at(track.first_token),
                finished: at(track.finished),
                admission_rank: (track.admission_rank != NEVER).then_some(track.admission_rank),
                input_tokens: request.input_length,
                output_tokens: request.output_length,
                hit_tokens: track.hit_tokens,
                preemptions: track.preemptions,
                priority: track.priority,
                outcome: track.outcome,
            };
            if timeline.outcome.was_accepted() {
                hits.record_tokens(
                    request.input_length,
                    request.input_length.div_ceil(block_size as u64),
                    track.hit_tokens,
                    block_size,
                );
            }
            timelines.push(timeline);
        }
        let first_arrival = self
            .arrivals
            .first()
            .and_then(|&index| self.tracks.get(index))
            .map_or(0, |track| track.arrival);
        let counters = &self.counters;
        // Every admission the plans showed is one the census counted.
        debug_assert_eq!(counters.admitted_hit_tokens, census.prefix_hit_tokens);
        let (ttft, tpot, e2e) = report::latencies(&timelines);
        Ok(ServeReport {
            block_size,
            capacity_blocks,
            eviction: self.eviction,
            scheduler: *self.scheduler.config(),
            step_time: self.step_time,
            hits,
            rejected_requests: counters.rejected,
            admissions: AdmissionStats {
                admissions: counters.admissions,
                admitted_tokens: census.prompt_tokens,
                admitted_hit_tokens: census.prefix_hit_tokens,
            },
            census,
            preemptions: counters.preemptions,
            evictions: self.scheduler.manager().metrics().evictions,
            steps: counters.steps,
            scheduled_requests: counters.scheduled_requests,
            prefill_tokens: counters.prefill_tokens,
            decode_tokens: counters.decode_tokens,
            spec_proposed_tokens: census.spec_proposed_tokens,
            spec_accepted_tokens: census.spec_accepted_tokens,
            output_tokens: counters.output_tokens,
            ttft_by_priority: report::ttft_by_priority(&timelines),
            ttft,
            tpot,
            e2e,
            max_running: counters.max_running,
            max_waiting: counters.max_waiting,
            sim_duration: Duration::from_nanos(self.now.saturating_sub(first_arrival)),
            busy_time: Duration::from_nanos(counters.busy),
            replay_time: Duration::ZERO,
            scheduler_time: self.scheduler_clock.total(),
            kv_events: self.events.as_ref().map(|tap| {
                // The lower tiers' events go out on the same stream.
                (self.lower_events.iter())
                    .fold(tap.counts(), |all, (_, tap)| all.plus(&tap.counts()))
            }),
            tiers: self.tier_report(),
            data_plane: (self.transfers.as_ref()).and_then(EngineTransfers::data_plane_report),
            kv: self.kv.as_ref().map(KvPeaks::report),
            requests: timelines,
        })
    }

    /// What the tiers below the GPU did (`None` without them).
    fn tier_report(&self) -> Option<TierReport> {
        let links = &self.transfers.as_ref()?.links;
        let tiers = self.scheduler.tiers()?;
        let block_size = self.scheduler.manager().block_size() as u64;
        let figures = (tiers.lower_ids().enumerate())
            .map(|(index, tier)| {
                let stats = tiers.stats(tier).unwrap_or_default();
                let bytes = links.bytes.get(index).copied().unwrap_or_default();
                TierFigures {
                    medium: (tiers.config(tier)).map_or_else(String::new, |c| c.medium.clone()),
                    capacity_blocks: tiers.config(tier).map_or(0, |c| c.blocks),
                    hit_tokens: stats.loaded_blocks.saturating_mul(block_size),
                    stored_blocks: stats.stored_blocks,
                    loaded_blocks: stats.loaded_blocks,
                    evicted_blocks: stats.evicted_blocks,
                    bytes_stored: bytes[0],
                    bytes_loaded: bytes[1],
                    failed_loads: stats.failed_loads,
                    skipped_stores: stats.skipped_stores,
                }
            })
            .collect();
        let onboard = self.scheduler.onboard_stats();
        let counters = &self.counters;
        Some(TierReport {
            tiers: figures,
            onboarding: OnboardFigures {
                requests: onboard.requests,
                blocks: onboard.blocks,
                mean_stall: Duration::from_nanos(
                    counters.stall.checked_div(counters.onboarded).unwrap_or(0),
                ),
                timeouts: onboard.timeouts,
                declined: onboard.declined,
            },
        })
    }
}
