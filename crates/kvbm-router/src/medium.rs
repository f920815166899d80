//! [`Media`]: the storage media a router has seen, each named once and
//! numbered by a [`Slot`], at most [`MAX_MEDIA`] of them.

use std::sync::{Mutex, OnceLock, PoisonError};

use crate::RouterError;

/// Media a router tracks, the device medium included: what a peer naming
/// new media can make it allocate is bounded by this many sets per worker
/// and names per router.
pub(crate) const MAX_MEDIA: usize = 8;

/// The longest medium name kept, in bytes (vLLM's are `"GPU"`, `"CPU"`,
/// `"STORAGE"`).
pub(crate) const MAX_MEDIUM_NAME: usize = 64;

/// The device medium's name, as vLLM writes it; an event without a medium
/// means it too.
pub(crate) const DEVICE: &str = "GPU";

/// A medium's number in its router: 0 is the device medium, the others in
/// the order they were first stored on.
pub(crate) type Slot = usize;

/// The device medium's slot.
pub(crate) const DEVICE_SLOT: Slot = 0;

/// Names of the media besides the device medium, in slot order (slot 1
/// first). Names are only ever appended, so a reader walks the filled
/// prefix without a lock; an append takes `adding`.
#[derive(Debug)]
pub(crate) struct Media {
    names: [OnceLock<Box<str>>; MAX_MEDIA - 1],
    adding: Mutex<()>,
}

impl Default for Media {
    fn default() -> Self {
        Self {
            names: std::array::from_fn(|_| OnceLock::new()),
            adding: Mutex::new(()),
        }
    }
}

impl Media {
    /// `medium`'s slot, if it was ever stored on (never allocates, never
    /// locks).
    pub(crate) fn find(&self, medium: Option<&str>) -> Option<Slot> {
        let name = match medium {
            None | Some(DEVICE) => return Some(DEVICE_SLOT),
            Some(name) => name,
        };
        for (at, slot) in self.names.iter().enumerate() {
            match slot.get() {
                Some(known) if **known == *name => return Some(at + 1),
                Some(_) => {}
                None => return None,
            }
        }
        None
    }

    /// `medium`'s slot, given one if it is new.
    ///
    /// # Errors
    ///
    /// [`RouterError::TooManyMedia`] if every slot is taken,
    /// [`RouterError::MediumNameTooLong`]; nothing changes.
    pub(crate) fn admit(&self, medium: Option<&str>) -> Result<Slot, RouterError> {
        if let Some(slot) = self.find(medium) {
            return Ok(slot);
        }
        let name = medium.unwrap_or(DEVICE);
        if name.len() > MAX_MEDIUM_NAME {
            return Err(RouterError::MediumNameTooLong {
                len: name.len(),
                max: MAX_MEDIUM_NAME,
            });
        }
        let _adding = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        // Another thread may have added it meanwhile.
        if let Some(slot) = self.find(medium) {
            return Ok(slot);
        }
        match self.names.iter().position(|slot| slot.get().is_none()) {
            Some(at) => {
                // Only appends under `adding`: the slot is still empty.
                let _ = self.names[at].set(name.into());
                Ok(at + 1)
            }
            None => Err(RouterError::TooManyMedia {
                medium: name.to_owned(),
                max: MAX_MEDIA,
            }),
        }
    }

    /// How many media have a slot, the device medium included.
    pub(crate) fn len(&self) -> usize {
        1 + self.names.iter().take_while(|n| n.get().is_some()).count()
    }
}
