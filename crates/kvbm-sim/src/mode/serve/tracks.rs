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

use kvbm_queue::Priority;

use super::draws::{self, Stream};
use super::{NEVER, PriorityMix, ServeOutcome, priority_from_vllm};
use crate::trace::arrival_nanos;
use crate::{SimError, TraceRequest};

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
    /// No requests yet: they are added by [`get_or_insert`](Self::get_or_insert).
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
                                bytes: (tracks.len() as u64 + 1).saturating_mul(TRACK_BYTES as u64),
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

/// One request's life, in nanoseconds of simulated time.
///
/// Serve mode's engine keeps one per trace request, a cluster's engine one
/// per request routed to it ([`Tracks`]); its size is a term of cluster
/// mode's memory estimate ([`TRACK_BYTES`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Track {
    pub(super) arrival: u64,
    pub(super) admitted: u64,
    pub(super) first_token: u64,
    pub(super) finished: u64,
    /// Order of first admission, `NEVER` before it.
    pub(super) admission_rank: u64,
    /// Prefix tokens matched at the first admission.
    pub(super) hit_tokens: u64,
    pub(super) preemptions: u32,
    pub(super) priority: Priority,
    /// Admitted and holding blocks, as far as the plans have said.
    pub(super) running: bool,
    /// When it began waiting for loads from a lower tier, `NEVER` if not.
    pub(super) onboarding_since: u64,
    pub(super) outcome: ServeOutcome,
}

/// Bytes an engine keeps per request it knows (its [`Track`]).
pub(crate) const TRACK_BYTES: usize = size_of::<Track>();

/// The record of request `index` before it arrives.
///
/// # Errors
///
/// [`SimError::TimestampTooLarge`] for a timestamp the clock cannot hold
/// (never, for a checked [`Trace`](crate::Trace)).
pub(super) fn new_track(
    index: usize,
    request: &TraceRequest,
    priorities: Option<&PriorityMix>,
    seed: u64,
) -> Result<Track, SimError> {
    let arrival = arrival_nanos(request.timestamp).ok_or(SimError::TimestampTooLarge {
        line: index + 1,
        timestamp: request.timestamp,
    })?;
    Ok(Track {
        arrival,
        admitted: NEVER,
        first_token: NEVER,
        finished: NEVER,
        admission_rank: NEVER,
        hit_tokens: 0,
        preemptions: 0,
        priority: match (request.priority, priorities) {
            (Some(value), _) => priority_from_vllm(value),
            (None, Some(mix)) => mix.pick(draws::unit(seed, Stream::Priority, index as u64, 0)),
            (None, None) => Priority::Normal,
        },
        running: false,
        onboarding_since: NEVER,
        outcome: ServeOutcome::Pending,
    })
}
