//! The pool's self-check: every slot recounted and cross-checked against
//! the free list, the registry and the inactive pool. It is the oracle of the
//! model, loom and stress tests, so it must catch every corruption it names.

use super::{PoolState, SlotState};
use crate::{BlockError, BlockId, PoolAudit};

impl PoolState {
    /// Recounts every slot from scratch and cross-checks the free list, the
    /// registry and the inactive pool against the per-slot states.
    pub(crate) fn audit(&self) -> Result<PoolAudit, BlockError> {
        let fail = |msg: String| Err(BlockError::InvariantViolated(msg));
        let mut audit = PoolAudit::default();
        let mut on_free_list = vec![false; self.slots.len()];
        let mut listed = 0;
        for id in self.free.walk(&self.slots) {
            if std::mem::replace(&mut on_free_list[id.index()], true) {
                return fail(format!("{id} is on the free list twice"));
            }
            listed += 1;
        }
        if listed != self.free.len() {
            return fail(format!(
                "the free list links {listed} blocks and counts {}",
                self.free.len()
            ));
        }
        for (index, slot) in self.slots.iter().enumerate() {
            let id = BlockId::new(index as u32);
            let cached = self.inactive.contains(id);
            if on_free_list[index] != (slot.state() == SlotState::Free) {
                return fail(format!(
                    "{id} is {:?} but free-listed: {}",
                    slot.state(),
                    on_free_list[index]
                ));
            }
            match slot.state() {
                SlotState::Free => audit.free_blocks += 1,
                SlotState::Held => audit.held_blocks += 1,
                SlotState::Registered if slot.refs == 0 => audit.inactive_blocks += 1,
                SlotState::Registered => audit.active_blocks += 1,
                SlotState::Duplicate => audit.duplicate_blocks += 1,
            }
            let should_be_cached = slot.state() == SlotState::Registered && slot.refs == 0;
            if cached != should_be_cached {
                return fail(format!(
                    "{id} is {:?} with {} refs but cached: {cached}",
                    slot.state(),
                    slot.refs
                ));
            }
            if slot.state() == SlotState::Duplicate && slot.refs == 0 {
                return fail(format!("duplicate {id} has no references"));
            }
            if slot.state() == SlotState::Registered && self.registered(slot.value()) != Some(id) {
                return fail(format!("registered {id} is not in the registry"));
            }
        }
        audit.registered_hashes = self.registry.len();
        if audit.registered_hashes != audit.active_blocks + audit.inactive_blocks {
            return fail(format!(
                "registry holds {} hashes for {} registered blocks",
                audit.registered_hashes,
                audit.active_blocks + audit.inactive_blocks
            ));
        }
        if audit.inactive_blocks != self.inactive.len() {
            return fail(format!(
                "inactive pool counts {} blocks, slots say {}",
                self.inactive.len(),
                audit.inactive_blocks
            ));
        }
        Ok(audit)
    }
}
