//! What a scheduler step plans and what applying it changed, as Python
//! objects: `StepPlan`, `PrefillWork`, `DecodeWork`, `StepReport`, `Finished`.
//!
//! A plan keeps the Rust plan and builds its lists on access, so a step
//! whose work Python reads only in part pays only for that part.

use kvbm_blocks::BlockId;
use kvbm_queue::{
    DecodeWork as RustDecode, FinishReason, Finished as RustFinished, GroupBlocks,
    PrefillWork as RustPrefill, StepPlan as RustPlan, StepReport as RustReport,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator, PyList};

fn ids(blocks: &[BlockId]) -> Vec<u32> {
    blocks.iter().map(|id| id.get()).collect()
}

/// Each KV cache group's table update as ``(first_block, new_blocks)``.
fn group_updates(groups: &[GroupBlocks]) -> Vec<(usize, Vec<u32>)> {
    (groups.iter())
        .map(|group| (group.first_block, ids(&group.new_blocks)))
        .collect()
}

/// A finish reason's name.
fn reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::MaxTokens => "max_tokens",
        FinishReason::Stop => "stop",
        FinishReason::Aborted => "aborted",
        FinishReason::Cancelled => "cancelled",
        FinishReason::CapacityExceeded => "capacity_exceeded",
        _ => "unknown",
    }
}

/// A request that left the scheduler: its id, why (``"max_tokens"``,
/// ``"stop"``, ``"aborted"``, ``"cancelled"`` or ``"capacity_exceeded"``)
/// and how many tokens it generated.
#[pyclass(module = "kvbm", frozen, eq, get_all)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Finished {
    /// The request id.
    request_id: u64,
    /// Why it finished.
    reason: &'static str,
    /// Tokens it generated.
    generated_tokens: usize,
}

impl From<&RustFinished> for Finished {
    fn from(finished: &RustFinished) -> Self {
        Self {
            request_id: finished.id.0,
            reason: reason(finished.reason),
            generated_tokens: finished.generated_tokens,
        }
    }
}

#[pymethods]
impl Finished {
    fn __repr__(&self) -> String {
        format!(
            "Finished(request_id={}, reason='{}', generated_tokens={})",
            self.request_id, self.reason, self.generated_tokens
        )
    }
}

/// A prefill chunk: compute the KV of tokens ``start .. start + num_tokens``
/// of request ``request_id``; ``emits_token`` when the chunk ends the prompt
/// and samples the first token. ``new_blocks`` extend its block table (they
/// are the whole table when ``resumed``). With KV cache groups, ``groups``
/// holds each group's ``(first_block, new_blocks)`` on a step that changes
/// the tables (``new_blocks`` repeats the first group's), and is empty on
/// the others and for a one-group scheduler.
#[pyclass(module = "kvbm", frozen, get_all)]
#[derive(Clone, Debug)]
pub(crate) struct PrefillWork {
    /// The request id.
    request_id: u64,
    /// The chunk's first token position.
    start: usize,
    /// Tokens in the chunk.
    num_tokens: usize,
    /// Whether the chunk samples a token.
    emits_token: bool,
    /// Block ids to append to the table.
    new_blocks: Vec<u32>,
    /// Whether the table starts fresh.
    resumed: bool,
    /// Each KV cache group's ``(first_block, new_blocks)``.
    groups: Vec<(usize, Vec<u32>)>,
}

impl From<&RustPrefill> for PrefillWork {
    fn from(work: &RustPrefill) -> Self {
        Self {
            request_id: work.id.0,
            start: work.start,
            num_tokens: work.num_tokens,
            emits_token: work.emits_token,
            new_blocks: ids(&work.new_blocks),
            resumed: work.resumed,
            groups: group_updates(&work.groups),
        }
    }
}

#[pymethods]
impl PrefillWork {
    fn __repr__(&self) -> String {
        format!(
            "PrefillWork(request_id={}, start={}, num_tokens={}, emits_token={}, new_blocks={:?}, resumed={})",
            self.request_id,
            self.start,
            self.num_tokens,
            if self.emits_token { "True" } else { "False" },
            self.new_blocks,
            if self.resumed { "True" } else { "False" }
        )
    }
}

/// A decode: compute the KV of the token at ``position`` of request
/// ``request_id`` (and ``draft_tokens`` drafts after it) and sample the next.
/// ``new_blocks`` and ``groups`` as ``PrefillWork``'s.
#[pyclass(module = "kvbm", frozen, get_all)]
#[derive(Clone, Debug)]
pub(crate) struct DecodeWork {
    /// The request id.
    request_id: u64,
    /// The position whose KV is computed.
    position: usize,
    /// Draft tokens verified after it (speculative decoding).
    draft_tokens: usize,
    /// Block ids to append to the table.
    new_blocks: Vec<u32>,
    /// Whether the table starts fresh.
    resumed: bool,
    /// Each KV cache group's ``(first_block, new_blocks)``.
    groups: Vec<(usize, Vec<u32>)>,
}

impl From<&RustDecode> for DecodeWork {
    fn from(work: &RustDecode) -> Self {
        Self {
            request_id: work.id.0,
            position: work.position,
            draft_tokens: work.draft_tokens,
            new_blocks: ids(&work.new_blocks),
            resumed: work.resumed,
            groups: group_updates(&work.groups),
        }
    }
}

#[pymethods]
impl DecodeWork {
    fn __repr__(&self) -> String {
        format!(
            "DecodeWork(request_id={}, position={}, draft_tokens={}, new_blocks={:?}, resumed={})",
            self.request_id,
            self.position,
            self.draft_tokens,
            self.new_blocks,
            if self.resumed { "True" } else { "False" }
        )
    }
}

/// One engine iteration: which requests prefill which tokens, which
/// decode, who was preempted and who left while planning. Iterating yields
/// the prefill chunks, then the decodes.
#[pyclass(module = "kvbm", frozen)]
#[derive(Debug)]
pub(crate) struct StepPlan {
    plan: RustPlan,
}

impl StepPlan {
    pub(crate) fn new(plan: RustPlan) -> Self {
        Self { plan }
    }

    /// The Rust plan, for the scheduler's lookups of the pending step.
    pub(crate) fn inner(&self) -> &RustPlan {
        &self.plan
    }
}

#[pymethods]
impl StepPlan {
    /// The step's number, from 0.
    #[getter]
    fn step(&self) -> u64 {
        self.plan.step
    }

    /// Prompt chunks to compute.
    #[getter]
    fn prefill(&self) -> Vec<PrefillWork> {
        self.plan.prefill.iter().map(PrefillWork::from).collect()
    }

    /// Requests that decode.
    #[getter]
    fn decode(&self) -> Vec<DecodeWork> {
        self.plan.decode.iter().map(DecodeWork::from).collect()
    }

    /// Ids of the requests scheduled, prefill chunks first.
    #[getter]
    fn request_ids(&self) -> Vec<u64> {
        let prefill = self.plan.prefill.iter().map(|p| p.id.0);
        prefill
            .chain(self.plan.decode.iter().map(|d| d.id.0))
            .collect()
    }

    /// Copies between tiers to run (a scheduler with lower tiers): the
    /// stores of blocks registered since the last plan and the loads of
    /// requests onboarding. Report each with ``Scheduler.report_transfers``
    /// when it ends, this step or a later one.
    #[getter]
    fn transfers(&self) -> Vec<crate::transfers::Transfer> {
        (self.plan.transfers.iter())
            .map(crate::transfers::Transfer::from)
            .collect()
    }

    /// Ids of the requests preempted this step (they wait again).
    #[getter]
    fn preempted(&self) -> Vec<u64> {
        self.plan.preempted.iter().map(|id| id.0).collect()
    }

    /// Requests that left while planning.
    #[getter]
    fn finished(&self) -> Vec<Finished> {
        self.plan.finished.iter().map(Finished::from).collect()
    }

    /// Tokens computed this step (draft tokens included).
    #[getter]
    fn num_tokens(&self) -> usize {
        self.plan.num_tokens()
    }

    /// Whether nothing is computed this step.
    #[getter]
    fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    /// What an engine that samples ``token`` wherever one is due reports:
    /// ``{request_id: token}``, ``None`` for chunks that sample nothing. For
    /// tests and simulations; pass it to ``Scheduler.apply``.
    fn sample_all<'py>(
        &self,
        py: Python<'py>,
        token: crate::args::U32,
    ) -> PyResult<Bound<'py, PyDict>> {
        let token = token.0;
        let outputs = PyDict::new(py);
        for prefill in &self.plan.prefill {
            let sampled = prefill.emits_token.then_some(token);
            outputs.set_item(prefill.id.0, sampled)?;
        }
        for decode in &self.plan.decode {
            outputs.set_item(decode.id.0, token)?;
        }
        Ok(outputs)
    }

    fn __len__(&self) -> usize {
        self.plan.prefill.len() + self.plan.decode.len()
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        let list = PyList::empty(py);
        for prefill in &self.plan.prefill {
            list.append(PrefillWork::from(prefill))?;
        }
        for decode in &self.plan.decode {
            list.append(DecodeWork::from(decode))?;
        }
        PyIterator::from_object(&list)
    }

    fn __repr__(&self) -> String {
        format!(
            "StepPlan(step={}, prefill={}, decode={}, preempted={}, finished={}, num_tokens={})",
            self.plan.step,
            self.plan.prefill.len(),
            self.plan.decode.len(),
            self.plan.preempted.len(),
            self.plan.finished.len(),
            self.plan.num_tokens()
        )
    }
}

/// What applying a step changed.
#[pyclass(module = "kvbm", frozen)]
#[derive(Debug)]
pub(crate) struct StepReport {
    report: RustReport,
}

impl StepReport {
    pub(crate) fn new(report: RustReport) -> Self {
        Self { report }
    }
}

#[pymethods]
impl StepReport {
    /// The step applied.
    #[getter]
    fn step(&self) -> u64 {
        self.report.step
    }

    /// Ids of the requests that produced their first token.
    #[getter]
    fn first_tokens(&self) -> Vec<u64> {
        self.report.first_tokens.iter().map(|id| id.0).collect()
    }

    /// Tokens generated this step, over all requests.
    #[getter]
    fn generated_tokens(&self) -> usize {
        self.report.generated_tokens
    }

    /// Requests that finished.
    #[getter]
    fn finished(&self) -> Vec<Finished> {
        self.report.finished.iter().map(Finished::from).collect()
    }

    /// Draft tokens verified this step.
    #[getter]
    fn verified_draft_tokens(&self) -> usize {
        self.report.verified_draft_tokens
    }

    /// Of those, the ones accepted.
    #[getter]
    fn accepted_draft_tokens(&self) -> usize {
        self.report.accepted_draft_tokens
    }

    /// Blocks given back after speculative steps, by request id (last table
    /// entry first).
    #[getter]
    fn rolled_back<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for rolled in &self.report.rolled_back {
            dict.set_item(rolled.id.0, ids(&rolled.blocks))?;
        }
        Ok(dict)
    }

    /// With KV cache groups, each group's blocks given back, by request id:
    /// a list per group, in group order (each last table entry first).
    /// Empty for a model of one group (``rolled_back`` has them).
    #[getter]
    fn rolled_back_groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for rolled in self.report.rolled_back.iter() {
            if rolled.groups.is_empty() {
                continue;
            }
            let groups: Vec<Vec<u32>> = rolled.groups.iter().map(|g| ids(g)).collect();
            dict.set_item(rolled.id.0, groups)?;
        }
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        format!(
            "StepReport(step={}, first_tokens={}, generated_tokens={}, finished={})",
            self.report.step,
            self.report.first_tokens.len(),
            self.report.generated_tokens,
            self.report.finished.len()
        )
    }
}
