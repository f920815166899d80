//! [`Lease`]: ownership of one held (allocated, unregistered) block.

use crate::BlockId;
use crate::pool::Shared;
use crate::sync::Arc;

/// Owns a block in the `Held` state and frees it on drop, unless disarmed by
/// the registration that turns it into a registered block.
pub(crate) struct Lease {
    shared: Arc<Shared>,
    id: BlockId,
    armed: bool,
}

impl Lease {
    pub(crate) fn new(shared: Arc<Shared>, id: BlockId) -> Self {
        Self {
            shared,
            id,
            armed: true,
        }
    }

    pub(crate) fn id(&self) -> BlockId {
        self.id
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The block's state has moved on (it was registered); dropping this
    /// lease must not free it.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            self.shared.lock().free_held(self.id);
        }
    }
}
