//! [`Tracks`]: an engine's record of each request's life, for every trace
//! request (serve mode, whose engine is given the whole trace) or for the
//! requests routed to it (an engine of a cluster).
//!
//! A cluster engine used to keep a record of every trace request too,
//! since the router may send it any of them: at 1,024 engines and a trace
//! replicated 64 times (770,000 requests) that was 50 GB of records, and
//! every engine's report walked all of them. Now it keeps one per request
//! it was given, found by the request's index through a hash map (touched
//! on admissions, preemptions, first tokens and exits, never per decode).

use std::collections::HashMap;

use super::Track;
use crate::SimError;

/// One [`Track`] per request an engine knows, by request index.
pub(super) enum Tracks {
    /// Every trace request's, at its index.
    All(Vec<Track>),
    /// The requests given to this engine, in the order they were given.
    Routed {
        /// Their indices, in order (parallel to `tracks`).
        indices: Vec<usize>,
        tracks: Vec<Track>,
        /// Each index's position in `tracks`.
        slots: HashMap<usize, usize, foldhash::fast::FixedState>,
    },
}

impl Tracks {
    /// No requests yet: they are added by [`insert`](Self::insert).
    pub(super) fn routed() -> Self {
        Self::Routed {
            indices: Vec::new(),
            tracks: Vec::new(),
            slots: HashMap::default(),
        }
    }

    /// Request `index`'s record, if this engine has one.
    #[inline]
    pub(super) fn get(&self, index: usize) -> Option<&Track> {
        match self {
            Self::All(tracks) => tracks.get(index),
            Self::Routed { tracks, slots, .. } => tracks.get(*slots.get(&index)?),
        }
    }

    /// Request `index`'s record, mutably, if this engine has one.
    #[inline]
    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut Track> {
        match self {
            Self::All(tracks) => tracks.get_mut(index),
            Self::Routed { tracks, slots, .. } => tracks.get_mut(*slots.get(&index)?),
        }
    }

    /// Request `index`'s record, made by `make` if this engine has none
    /// (only a routed engine lacks any; `None` for an index past the
    /// trace).
    ///
    /// # Errors
    ///
    /// `make`'s, and [`SimError::OutOfMemory`] if the record cannot be
    /// stored.
    pub(super) fn get_or_insert(
        &mut self,
        index: usize,
        make: impl FnOnce() -> Result<Track, SimError>,
    ) -> Result<Option<&mut Track>, SimError> {
        match self {
            Self::All(tracks) => Ok(tracks.get_mut(index)),
            Self::Routed {
                indices,
                tracks,
                slots,
            } => {
                let slot = match slots.get(&index) {
                    Some(&slot) => slot,
                    None => {
                        let track = make()?;
                        // Fallible, as the dense records were: a cluster
                        // holds one of these per routed request.
                        if indices.try_reserve(1).is_err()
                            || tracks.try_reserve(1).is_err()
                            || slots.try_reserve(1).is_err()
                        {
                            return Err(SimError::OutOfMemory {
                                what: "an engine's per-request state",
                                bytes: (tracks.len() as u64 + 1)
                                    .saturating_mul(super::TRACK_BYTES as u64),
                            });
                        }
                        indices.push(index);
                        tracks.push(track);
                        slots.insert(index, tracks.len() - 1);
                        tracks.len() - 1
                    }
                };
                Ok(tracks.get_mut(slot))
            }
        }
    }

    /// How many records.
    pub(super) fn len(&self) -> usize {
        match self {
            Self::All(tracks) => tracks.len(),
            Self::Routed { tracks, .. } => tracks.len(),
        }
    }

    /// Every record with its request index: by index for
    /// [`All`](Self::All), in the order given for [`Routed`](Self::Routed).
    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, &Track)> {
        let (all, routed) = match self {
            Self::All(tracks) => (Some(tracks.iter().enumerate()), None),
            Self::Routed {
                indices, tracks, ..
            } => (None, Some(indices.iter().copied().zip(tracks))),
        };
        all.into_iter()
            .flatten()
            .chain(routed.into_iter().flatten())
    }

    /// The request indices of [`iter`](Self::iter), in its order.
    pub(super) fn indices(&self) -> Vec<usize> {
        match self {
            Self::All(tracks) => (0..tracks.len()).collect(),
            Self::Routed { indices, .. } => indices.clone(),
        }
    }
}
