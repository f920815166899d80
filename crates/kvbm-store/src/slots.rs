//! [`Slots`]: a preallocated region of fixed-size slots in a few contiguous
//! stripes, each behind its own lock.
//!
//! One `Vec<u8>` per stripe keeps the region in a handful of large
//! allocations an engine can register for DMA (no allocation per block),
//! while copies into different stripes run in parallel without `unsafe`.

use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use crate::StoreError;

/// Stripes a region is cut into at most: enough that workers copying
/// different blocks rarely meet on one lock.
const MAX_STRIPES: usize = 64;

/// `slots` slots of `block_bytes` bytes.
#[derive(Debug)]
pub(crate) struct Slots {
    block_bytes: usize,
    slots: usize,
    per_stripe: usize,
    stripes: Vec<RwLock<Vec<u8>>>,
}

impl Slots {
    /// The region, zeroed, or an error if it cannot be addressed or
    /// allocated (never an abort).
    pub(crate) fn new(block_bytes: usize, slots: usize) -> Result<Self, StoreError> {
        if block_bytes == 0 || slots == 0 {
            return Err(StoreError::Config(format!(
                "{slots} slots of {block_bytes} bytes: both must be at least 1"
            )));
        }
        if u32::try_from(slots).is_err() {
            return Err(StoreError::Config(format!(
                "{slots} slots: at most {} are addressable",
                u32::MAX
            )));
        }
        let stripes = slots.min(MAX_STRIPES);
        let per_stripe = slots.div_ceil(stripes);
        let stripe_bytes = per_stripe.checked_mul(block_bytes).ok_or_else(|| {
            StoreError::Config(format!("{slots} slots of {block_bytes} bytes overflow"))
        })?;
        let mut region = Vec::new();
        region.try_reserve_exact(stripes).map_err(too_big)?;
        let mut left = slots;
        for _ in 0..stripes {
            let here = left.min(per_stripe);
            left -= here;
            let mut stripe = Vec::new();
            stripe
                .try_reserve_exact(here * block_bytes)
                .map_err(too_big)?;
            stripe.resize(here * block_bytes, 0);
            region.push(RwLock::new(stripe));
        }
        debug_assert!(stripe_bytes >= block_bytes);
        Ok(Self {
            block_bytes,
            slots,
            per_stripe,
            stripes: region,
        })
    }

    pub(crate) fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.slots
    }

    /// The stripe of `slot` and the slot's byte offset in it.
    fn place(&self, slot: usize) -> Option<(usize, usize)> {
        (slot < self.slots).then(|| {
            (
                slot / self.per_stripe,
                (slot % self.per_stripe) * self.block_bytes,
            )
        })
    }

    fn check_len(&self, got: usize) -> Result<(), StoreError> {
        if got == self.block_bytes {
            Ok(())
        } else {
            Err(StoreError::WrongSize {
                expected: self.block_bytes,
                got,
            })
        }
    }

    /// Copies `from` into `slot`.
    pub(crate) fn write(&self, slot: usize, from: &[u8]) -> Result<(), StoreError> {
        self.check_len(from.len())?;
        let (stripe, at) = self.place(slot).ok_or_else(|| no_slot(slot))?;
        let mut stripe = self.stripes[stripe]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        stripe[at..at + self.block_bytes].copy_from_slice(from);
        Ok(())
    }

    /// Copies `slot` into `into`.
    pub(crate) fn read(&self, slot: usize, into: &mut [u8]) -> Result<(), StoreError> {
        self.check_len(into.len())?;
        let guard = self.lock_read(slot)?;
        guard.copy_to(into);
        Ok(())
    }

    /// Holds `slot` for reading: a writer of any slot of its stripe waits
    /// until the guard is dropped.
    pub(crate) fn lock_read(&self, slot: usize) -> Result<SlotRead<'_>, StoreError> {
        let (stripe, at) = self.place(slot).ok_or_else(|| no_slot(slot))?;
        Ok(SlotRead {
            stripe: self.stripes[stripe]
                .read()
                .unwrap_or_else(PoisonError::into_inner),
            at,
            len: self.block_bytes,
        })
    }
}

/// One slot held for reading.
#[derive(Debug)]
pub(crate) struct SlotRead<'a> {
    stripe: RwLockReadGuard<'a, Vec<u8>>,
    at: usize,
    len: usize,
}

impl SlotRead<'_> {
    /// Copies the slot into `into` (the block size long, checked by the
    /// caller).
    pub(crate) fn copy_to(&self, into: &mut [u8]) {
        into.copy_from_slice(&self.stripe[self.at..self.at + self.len]);
    }
}

fn too_big(err: std::collections::TryReserveError) -> StoreError {
    StoreError::Config(format!("the region cannot be allocated: {err}"))
}

fn no_slot(slot: usize) -> StoreError {
    StoreError::Config(format!("slot {slot} is past the region"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_in_every_stripe_keep_their_own_bytes() {
        let slots = Slots::new(3, 130).unwrap();
        for slot in 0..130 {
            slots.write(slot, &[slot as u8; 3]).unwrap();
        }
        let mut out = [0u8; 3];
        for slot in 0..130 {
            slots.read(slot, &mut out).unwrap();
            assert_eq!(out, [slot as u8; 3]);
        }
        assert!(slots.read(130, &mut out).is_err());
        assert!(matches!(
            slots.write(0, &[0; 4]),
            Err(StoreError::WrongSize {
                expected: 3,
                got: 4
            })
        ));
    }

    #[test]
    fn sizes_that_cannot_be_addressed_are_refused() {
        assert!(Slots::new(0, 1).is_err());
        assert!(Slots::new(1, 0).is_err());
        assert!(Slots::new(usize::MAX, 2).is_err());
        assert!(Slots::new(1 << 40, 1 << 20).is_err());
    }
}
