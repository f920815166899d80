//! An engine's transfers between tiers: when each ends (the link model,
//! [`LinkClock`]) and, with `--data-plane`, the bytes each one really moves
//! and whether it really succeeded ([`SimDataPlane`]).

use kvbm_queue::Scheduler;
use kvbm_tiers::{Outcome, Transfer, TransferId};

use crate::SimError;
use crate::data_plane::{DataPlaneReport, DataPlaneSpec, SimDataPlane};
use crate::tiers::LinkClock;

/// One engine's transfers under way.
#[derive(Debug)]
pub(crate) struct EngineTransfers {
    pub(crate) links: LinkClock,
    data_plane: Option<SimDataPlane>,
    /// Reports and plans, reused every step.
    reports: Vec<(TransferId, Outcome)>,
    taken: Vec<Transfer>,
}

impl EngineTransfers {
    pub(crate) fn new(links: LinkClock) -> Self {
        Self {
            links,
            data_plane: None,
            reports: Vec::new(),
            taken: Vec::new(),
        }
    }

    /// Moves real bytes for every transfer from now on, through the stores
    /// `spec` names behind `scheduler`'s tiers.
    pub(crate) fn attach_data_plane<M>(
        &mut self,
        spec: &DataPlaneSpec,
        scheduler: &Scheduler<M>,
        block_bytes: u64,
    ) -> Result<(), SimError> {
        let tiers = scheduler.tiers().ok_or_else(|| SimError::DataPlane {
            reason: "--data-plane needs a tier below the GPU".into(),
        })?;
        self.data_plane = Some(SimDataPlane::new(spec, tiers, block_bytes)?);
        Ok(())
    }

    /// Starts `transfers` at `now`.
    pub(crate) fn start(&mut self, now: u64, transfers: &[Transfer]) -> Result<(), SimError> {
        self.links.start(now, transfers);
        if let Some(data_plane) = &mut self.data_plane {
            data_plane.start(transfers)?;
        }
        Ok(())
    }

    /// Starts, at `now`, the transfers `scheduler` planned since its last
    /// step (the stores of what its last `apply` registered).
    pub(crate) fn start_planned<M>(
        &mut self,
        now: u64,
        scheduler: &mut Scheduler<M>,
    ) -> Result<(), SimError> {
        self.taken.clear();
        scheduler.take_transfers(&mut self.taken);
        let taken = std::mem::take(&mut self.taken);
        let started = self.start(now, &taken);
        self.taken = taken;
        started
    }

    /// Reports every transfer that ended by `now` to `scheduler`: with a
    /// data plane, as it really ended.
    pub(crate) fn deliver<M>(
        &mut self,
        now: u64,
        scheduler: &mut Scheduler<M>,
    ) -> Result<(), SimError> {
        self.reports.clear();
        self.links.ended(now, &mut self.reports);
        if let Some(data_plane) = &mut self.data_plane {
            for (id, outcome) in &mut self.reports {
                *outcome = data_plane.outcome(*id);
            }
        }
        if !self.reports.is_empty() {
            scheduler.report_transfers(&self.reports)?;
        }
        Ok(())
    }

    /// When the next transfer under way ends.
    pub(crate) fn next_end(&self) -> Option<u64> {
        self.links.next_end()
    }

    /// What the data plane moved and checked, if there is one.
    pub(crate) fn data_plane_report(&self) -> Option<DataPlaneReport> {
        self.data_plane.as_ref().map(SimDataPlane::report)
    }
}
