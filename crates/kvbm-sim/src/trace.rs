//! [`Trace`]: Mooncake-format JSONL request traces, parsed and checked.
//!
//! One JSON object per line: `timestamp` (ms from the trace start, at most
//! [`MAX_TIMESTAMP_MS`]), `input_length` and `output_length` (tokens) and
//! `hash_ids` (one id per 512-token block of the prompt, the last block
//! possibly partial; equal ids at equal positions are a reusable prefix).
//! Unknown fields are ignored and blank lines skipped, so other Mooncake
//! traces load as they are.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tracing::instrument;

use crate::{NoProgress, Progress, SimError};

/// Tokens per `hash_ids` entry in a Mooncake trace.
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// The latest `timestamp` a trace line may have, in milliseconds: about
/// 292 years.
///
/// Simulated time counts `u64` nanoseconds (about 584 years). Arrivals may
/// use the first half of that range, so that every replay has the second
/// half, another 292 years, to finish what arrived last: a request at this
/// timestamp is simulated exactly, and one millisecond later is refused
/// ([`SimError::TimestampTooLarge`]). Unix-epoch milliseconds (about
/// 1.8 × 10^12 today) are well within it.
pub const MAX_TIMESTAMP_MS: u64 = (u64::MAX / 2) / NANOS_PER_MS;

/// Hash ids below this give different tokens at every position
/// ([`trace_token`](crate::trace_token) is a bijection there), so
/// [`Trace::replicate`]'s copies keep below it.
const DISTINCT_IDS: u64 = 1 << 32;

/// Nanoseconds (the simulated clock's unit) per trace millisecond.
const NANOS_PER_MS: u64 = 1_000_000;

/// `timestamp` (trace milliseconds) in simulated nanoseconds, `None` past
/// [`MAX_TIMESTAMP_MS`].
pub(crate) fn arrival_nanos(timestamp: u64) -> Option<u64> {
    if timestamp > MAX_TIMESTAMP_MS {
        return None;
    }
    timestamp.checked_mul(NANOS_PER_MS)
}

/// The embedded default: the first 500 requests of the Mooncake FAST'25
/// conversation trace (Apache-2.0; see `fixtures/PROVENANCE.md`).
pub const CONVERSATION_EXCERPT: &str = include_str!("../fixtures/conversation_excerpt.jsonl");

/// One request of a trace, exactly as a line of the file states it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Arrival time in milliseconds from the start of the trace (at most
    /// [`MAX_TIMESTAMP_MS`] in a checked [`Trace`]).
    pub timestamp: u64,
    /// Prompt length in tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    /// One id per 512-token prompt block; an id stands for its block *and*
    /// the whole prefix before it.
    pub hash_ids: Vec<u64>,
    /// The request's vLLM priority (lower is more urgent), if the line has
    /// one; serve mode maps it with
    /// [`priority_from_vllm`](crate::priority_from_vllm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
}

impl TraceRequest {
    /// Checks that `hash_ids` cover `input_length` in 512-token blocks, the
    /// last one possibly partial (no ids for an empty prompt).
    ///
    /// Also refuses a `timestamp` past [`MAX_TIMESTAMP_MS`], which the
    /// simulated clock could not follow, and an `output_length` beyond
    /// `u32::MAX`, the most tokens a request can ask to generate
    /// (`max_new_tokens` is a `u32`).
    fn check(&self, line: usize) -> Result<(), SimError> {
        if arrival_nanos(self.timestamp).is_none() {
            return Err(SimError::TimestampTooLarge {
                line,
                timestamp: self.timestamp,
            });
        }
        if u32::try_from(self.output_length).is_err() {
            return Err(SimError::OutputTooLong {
                line,
                output_length: self.output_length,
            });
        }
        let blocks = self.hash_ids.len() as u64;
        let block = TRACE_BLOCK_TOKENS as u64;
        let fits = match blocks {
            0 => self.input_length == 0,
            n => {
                (n - 1).saturating_mul(block) < self.input_length
                    && self.input_length <= n.saturating_mul(block)
            }
        };
        if fits {
            Ok(())
        } else {
            Err(SimError::InconsistentRequest {
                line,
                input_length: self.input_length,
                blocks: self.hash_ids.len(),
            })
        }
    }
}

/// A parsed, checked request trace, in file order.
#[derive(Clone, PartialEq, Eq)]
pub struct Trace {
    requests: Vec<TraceRequest>,
}

impl Trace {
    /// Checks in-memory requests and makes a trace of them.
    ///
    /// # Errors
    ///
    /// [`SimError::EmptyTrace`] for no requests, or
    /// [`SimError::InconsistentRequest`] (with the request's 1-based index as
    /// its line) when `hash_ids` do not cover `input_length`,
    /// [`SimError::OutputTooLong`] for an `output_length` beyond `u32::MAX`,
    /// or [`SimError::TimestampTooLarge`] for a `timestamp` past
    /// [`MAX_TIMESTAMP_MS`].
    pub fn from_requests(requests: Vec<TraceRequest>) -> Result<Self, SimError> {
        if requests.is_empty() {
            return Err(SimError::EmptyTrace);
        }
        for (index, request) in requests.iter().enumerate() {
            request.check(index + 1)?;
        }
        Ok(Self { requests })
    }

    /// Parses JSONL text, one request per non-blank line.
    ///
    /// # Errors
    ///
    /// [`SimError::MalformedLine`], [`SimError::InconsistentRequest`],
    /// [`SimError::OutputTooLong`] or [`SimError::TimestampTooLarge`] with
    /// the 1-based line number, or [`SimError::EmptyTrace`].
    pub fn from_jsonl(text: &str) -> Result<Self, SimError> {
        Self::parse(text, &mut NoProgress)
    }

    /// Reads and parses a JSONL trace file.
    ///
    /// # Errors
    ///
    /// [`SimError::TraceNotFound`], [`SimError::ReadTrace`], and the parse
    /// errors of [`from_jsonl`](Self::from_jsonl).
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, SimError> {
        Self::from_path_with_progress(path, &mut NoProgress)
    }

    /// Like [`from_path`](Self::from_path), reporting parsed bytes to
    /// `progress`.
    ///
    /// # Errors
    ///
    /// As [`from_path`](Self::from_path).
    #[instrument(level = "debug", skip_all, fields(path = %path.as_ref().display()))]
    pub fn from_path_with_progress(
        path: impl AsRef<Path>,
        progress: &mut dyn Progress,
    ) -> Result<Self, SimError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => SimError::TraceNotFound {
                path: path.to_owned(),
            },
            _ => SimError::ReadTrace {
                path: path.to_owned(),
                source,
            },
        })?;
        Self::parse(&text, progress)
    }

    /// The embedded default trace ([`CONVERSATION_EXCERPT`]).
    ///
    /// # Errors
    ///
    /// None in practice (the excerpt is checked by this crate's tests); the
    /// parse errors of [`from_jsonl`](Self::from_jsonl) otherwise.
    pub fn conversation_excerpt() -> Result<Self, SimError> {
        Self::from_jsonl(CONVERSATION_EXCERPT)
    }

    fn parse(text: &str, progress: &mut dyn Progress) -> Result<Self, SimError> {
        // Report progress every this many bytes: often enough for a smooth
        // bar, rarely enough to cost nothing.
        const REPORT_EVERY: usize = 1 << 18;
        progress.start("parsing", text.len() as u64);
        let mut requests = Vec::with_capacity(text.len() / 128);
        let (mut parsed, mut reported) = (0usize, 0usize);
        for (index, raw) in text.split_inclusive('\n').enumerate() {
            parsed += raw.len();
            if parsed - reported >= REPORT_EVERY {
                progress.advance((parsed - reported) as u64);
                reported = parsed;
            }
            let line = index + 1;
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let request: TraceRequest =
                serde_json::from_str(raw).map_err(|err| malformed(line, &err))?;
            request.check(line)?;
            requests.push(request);
        }
        progress.advance((parsed - reported) as u64);
        progress.finish();
        if requests.is_empty() {
            return Err(SimError::EmptyTrace);
        }
        Ok(Self { requests })
    }

    /// Keeps only the first `len` requests in file order (all of them if
    /// there are fewer).
    pub fn truncate(&mut self, len: std::num::NonZeroUsize) {
        self.requests.truncate(len.get());
    }

    /// `copies` copies of this trace in one, for a cluster `copies` times
    /// larger carrying the same load per engine (`kvbm-sim cluster
    /// --replicate N`).
    ///
    /// Copy `k` (`0..copies`) of request `i` is request `i × copies + k`,
    /// so the copies of a request arrive together, at its timestamp, and
    /// in the original's order among the others. Copy `k` offsets every
    /// hash id by `k × (the trace's largest id + 1)`: copy 0 is the trace
    /// itself, and no two copies share an id. The offset ids must stay
    /// below 2^32, where [`trace_token`](crate::trace_token) gives two ids
    /// different tokens at every position: so no block of one copy's
    /// prompts equals one of another's, and neither the engines' caches
    /// nor the router can match a prefix across copies.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidReplicate`] for no copies, for copies whose ids
    /// would reach 2^32, or whose request count overflows;
    /// [`SimError::OutOfMemory`] if the copies cannot be allocated.
    pub fn replicate(&self, copies: usize) -> Result<Self, SimError> {
        let (stride, len) = self.check_replicate(copies)?;
        let mut requests = Vec::new();
        (requests.try_reserve_exact(len)).map_err(|_| SimError::OutOfMemory {
            what: "the trace's copies",
            bytes: (len as u64).saturating_mul(size_of::<TraceRequest>() as u64),
        })?;
        for request in &self.requests {
            for copy in 0..copies as u64 {
                let offset = copy * stride;
                let mut hash_ids = Vec::new();
                (hash_ids.try_reserve_exact(request.hash_ids.len())).map_err(|_| {
                    SimError::OutOfMemory {
                        what: "the trace's copies",
                        bytes: (request.hash_ids.len() as u64).saturating_mul(8),
                    }
                })?;
                // Below 2^32 (`check_replicate`): no overflow.
                hash_ids.extend(request.hash_ids.iter().map(|&id| id + offset));
                requests.push(TraceRequest {
                    timestamp: request.timestamp,
                    input_length: request.input_length,
                    output_length: request.output_length,
                    hash_ids,
                    priority: request.priority,
                });
            }
        }
        Ok(Self { requests })
    }

    /// Checks that [`replicate`](Self::replicate) can make `copies`
    /// copies, without making them: the offset between two copies' ids,
    /// and the copies' request count.
    ///
    /// # Errors
    ///
    /// As [`replicate`](Self::replicate), but for memory.
    pub(crate) fn check_replicate(&self, copies: usize) -> Result<(u64, usize), SimError> {
        let invalid = |reason: String| SimError::InvalidReplicate { copies, reason };
        if copies == 0 {
            return Err(invalid("at least one copy is needed".to_owned()));
        }
        let max_id = (self.requests.iter())
            .flat_map(|request| request.hash_ids.iter().copied())
            .max()
            .unwrap_or(0);
        // Every copy's ids below 2^32: `copies × (max_id + 1) <= 2^32`.
        let stride = max_id.checked_add(1);
        let end = stride.and_then(|stride| stride.checked_mul(copies as u64));
        let (Some(stride), Some(_)) = (stride, end.filter(|&end| end <= DISTINCT_IDS)) else {
            return Err(invalid(format!(
                "the trace's largest block id is {max_id}, and every copy's ids must stay \
                 below 2^32 (where different ids give different tokens)"
            )));
        };
        let Some(len) = self.requests.len().checked_mul(copies) else {
            return Err(invalid(format!(
                "{} requests {copies} times overflow",
                self.requests.len()
            )));
        };
        Ok((stride, len))
    }

    /// The requests in file order.
    pub fn requests(&self) -> &[TraceRequest] {
        &self.requests
    }

    /// Number of requests (never zero).
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Always false: a trace has at least one request. Here for the
    /// `len`/`is_empty` convention.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Totals and means over the whole trace.
    pub fn summary(&self) -> TraceSummary {
        let mut summary = TraceSummary {
            requests: self.requests.len() as u64,
            input_tokens: 0,
            output_tokens: 0,
            trace_blocks: 0,
            duration_ms: 0,
        };
        let (mut first, mut last) = (u64::MAX, 0);
        for request in &self.requests {
            // Saturating: a checked trace cannot reach u64::MAX in practice,
            // but a summary must never be the thing that panics.
            summary.input_tokens = summary.input_tokens.saturating_add(request.input_length);
            summary.output_tokens = summary.output_tokens.saturating_add(request.output_length);
            summary.trace_blocks = summary
                .trace_blocks
                .saturating_add(request.hash_ids.len() as u64);
            first = first.min(request.timestamp);
            last = last.max(request.timestamp);
        }
        summary.duration_ms = last.saturating_sub(first);
        summary
    }
}

/// The JSON parser's message without its "at line 1 column N" suffix, which
/// would be misleading: each trace line is parsed on its own.
fn malformed(line: usize, err: &serde_json::Error) -> SimError {
    let message = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    let reason = message.strip_suffix(&suffix).unwrap_or(&message).to_owned();
    SimError::MalformedLine {
        line,
        column: err.column(),
        reason,
    }
}

impl fmt::Debug for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trace")
            .field("requests", &self.requests.len())
            .finish_non_exhaustive()
    }
}

/// Totals and means of a [`Trace`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceSummary {
    /// Requests in the trace.
    pub requests: u64,
    /// Prompt tokens over all requests.
    pub input_tokens: u64,
    /// Generated tokens over all requests.
    pub output_tokens: u64,
    /// `hash_ids` entries (512-token blocks) over all requests.
    pub trace_blocks: u64,
    /// Time from the first to the last arrival.
    pub duration_ms: u64,
}

impl TraceSummary {
    /// Mean prompt length in tokens.
    pub fn mean_input_tokens(&self) -> f64 {
        ratio(self.input_tokens, self.requests)
    }

    /// Mean generated length in tokens.
    pub fn mean_output_tokens(&self) -> f64 {
        ratio(self.output_tokens, self.requests)
    }
}

/// `numerator / denominator`, 0 for an empty denominator.
pub(crate) fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        0.0
    } else {
        numerator as f64 / denominator as f64
    }
}

#[cfg(test)]
mod tests;
