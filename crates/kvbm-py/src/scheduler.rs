//! `kvbm.Scheduler`: kvbm-queue's continuous-batching scheduler over its own
//! block pool.
//!
//! Submissions and cancellations go through the scheduler's thread-safe
//! submit handle, outside the lock that `step`, `apply` and the lookups
//! take: another Python thread can submit while a long step runs with the
//! GIL released.

use std::sync::{Arc, Mutex};

use kvbm_blocks::{BlockManager, EventSubscription};
use kvbm_queue::{
    EngineOutput, GenerationReserve, InferenceRequest, PAD_SLOT, Preemption, RequestId,
    Scheduler as RustScheduler, SchedulerConfig, SubmitHandle,
};
use kvbm_sequence::KvCacheGroups;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyType};

use crate::Device;
use crate::args::{Count, SaltArg, Tokens, U32, U64, priority};
use crate::convert;
use crate::errors::Error;
use crate::lock::lock;
use crate::plan::{Finished, StepPlan, StepReport};

/// Requests in play (running and waiting) from which `step` and `apply`
/// release the GIL: below it, a step takes microseconds and handing the
/// GIL to another thread would cost more than it frees.
const DETACH_REQUESTS: u64 = 64;

/// `array.array`, looked up once: `slot_mapping` returns one per step.
static ARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The scheduler and what it publishes, under one lock.
#[derive(Debug)]
struct State {
    scheduler: RustScheduler<Device>,
    events: Option<EventSubscription>,
}

/// A continuous-batching scheduler over a block pool of its own
/// (kvbm-queue's ``Scheduler``): ``submit`` requests, then each step call
/// ``step()`` for the plan, run the model, and ``apply()`` what it sampled.
/// Admission, chunked prefill, prefix caching and preemption happen inside.
/// Thread-safe: any thread may submit or cancel while another steps.
#[pyclass(module = "kvbm", frozen)]
#[derive(Debug)]
pub(crate) struct Scheduler {
    handle: SubmitHandle,
    manager: BlockManager<Device>,
    state: Mutex<State>,
}

/// The KV cache groups of `model` (a preset's name) or of `groups` (a
/// description of the layers, as kvbm-sim's `--groups`), made as vLLM
/// makes them, over `block_size`-token blocks; `None` for neither.
fn kv_groups(
    model: Option<&str>,
    groups: Option<&str>,
    block_size: usize,
) -> PyResult<Option<Arc<KvCacheGroups>>> {
    // The grouping does not depend on a token's bytes, which a scheduler
    // never sees: a description is parsed with one byte per token.
    let model = match (model, groups) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(Error::invalid("give model or groups, not both").into());
        }
        (Some(name), None) => kvbm_sim::KvModel::preset(name),
        (None, Some(spec)) => kvbm_sim::KvModel::parse_layers(spec, 1),
    }
    .map_err(Error::from)?;
    let groups = model.groups(block_size).map_err(Error::from)?;
    Ok(Some(Arc::new(groups)))
}

/// `full` or a token cap.
fn reserve(value: &Bound<'_, PyAny>) -> PyResult<GenerationReserve> {
    if let Ok(text) = value.cast::<PyString>() {
        if text.to_str()?.trim().eq_ignore_ascii_case("full") {
            return Ok(GenerationReserve::Full);
        }
        return Err(
            Error::invalid(format!("reserve `{text}` is neither \"full\" nor an int")).into(),
        );
    }
    let cap: Count = value.extract()?;
    let cap = u32::try_from(cap.0)
        .map_err(|_| Error::invalid(format!("reserve {} exceeds 4294967295 tokens", cap.0)))?;
    Ok(GenerationReserve::Capped(cap))
}

/// One engine output from a dict entry: an int (the sampled token), `None`
/// (a chunk that samples nothing) or a list (accepted drafts, then the
/// sampled token).
fn output(id: u64, value: &Bound<'_, PyAny>, stop: bool) -> PyResult<EngineOutput> {
    let id = RequestId(id);
    let output = if value.is_none() {
        EngineOutput::no_token(id)
    } else if let Ok(token) = value.extract::<crate::args::U32>() {
        EngineOutput::token(id, token.0)
    } else if value.is_instance_of::<pyo3::types::PyInt>() {
        // An int that is not a token: the refusal says why.
        return Err(value
            .extract::<crate::args::U32>()
            .err()
            .unwrap_or_else(|| PyTypeError::new_err("bad token")));
    } else {
        let Tokens(mut tokens) = value.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "the output of request {} must be a token (int), None, or a list of tokens",
                id.0
            ))
        })?;
        let Some(token) = tokens.pop() else {
            return Err(Error::invalid(format!(
                "the output of request {} is an empty list: it needs at least the sampled token",
                id.0
            ))
            .into());
        };
        EngineOutput::speculative(id, tokens, token)
    };
    Ok(if stop { output.with_stop() } else { output })
}

#[pymethods]
impl Scheduler {
    /// A scheduler over a new pool of ``num_blocks`` blocks of
    /// ``block_size`` tokens. The limits default to vLLM's (256 running
    /// requests, 8192 tokens per step, 2048-token prefill chunks, 1% of
    /// the pool kept free). ``reserve`` is the generated tokens admission
    /// reserves per request (an int cap, or ``"full"``); ``preemption`` is
    /// ``"never"`` or ``"priority"`` (a waiting request may preempt less
    /// urgent running ones). With ``events=True`` the pool's cache events
    /// are kept for ``take_events``.
    ///
    /// ``model`` (a preset's name, as ``replay_serve``'s) or ``groups``
    /// (its layers by kind, e.g. ``"sliding_window:128:18,full:18"``) runs
    /// the model's KV cache groups: each request holds a block table per
    /// group, and a sliding window's blocks behind it go back to the cache
    /// as it advances.
    ///
    /// ``host_blocks`` (and below it ``disk_blocks``) adds lower tiers:
    /// blocks are copied down as ``offload`` says (``"write-through"``,
    /// ``"write-back"`` or ``"selective:K"``), and a request whose prefix a
    /// lower tier holds waits onboarding (at most ``max_onboarding_blocks``
    /// loads at once, ``load_timeout_steps`` steps) while the engine runs
    /// the plans' ``transfers`` and reports them (``report_transfers``).
    /// With ``model`` or ``groups`` every group's blocks go down, and each
    /// group loads only the blocks it reads for the hit.
    #[new]
    #[pyo3(signature = (
        num_blocks,
        block_size = Count(16),
        *,
        max_running = Count(256),
        token_budget = Count(8192),
        chunk_size = Count(2048),
        watermark_blocks = None,
        reserve = None,
        prefix_credit = true,
        speculative_tokens = Count(0),
        preemption = "never",
        eviction = "lru",
        events = false,
        model = None,
        groups = None,
        host_blocks = None,
        disk_blocks = None,
        offload = "write-through",
        max_onboarding_blocks = Count(4096),
        load_timeout_steps = U64(256),
    ), text_signature = "(num_blocks, block_size=16, *, max_running=256, token_budget=8192, chunk_size=2048, watermark_blocks=None, reserve=None, prefix_credit=True, speculative_tokens=0, preemption='never', eviction='lru', events=False, model=None, groups=None, host_blocks=None, disk_blocks=None, offload='write-through', max_onboarding_blocks=4096, load_timeout_steps=256)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_blocks: Count,
        block_size: Count,
        max_running: Count,
        token_budget: Count,
        chunk_size: Count,
        watermark_blocks: Option<Count>,
        reserve: Option<&Bound<'_, PyAny>>,
        prefix_credit: bool,
        speculative_tokens: Count,
        preemption: &str,
        eviction: &str,
        events: bool,
        model: Option<&str>,
        groups: Option<&str>,
        host_blocks: Option<Count>,
        disk_blocks: Option<Count>,
        offload: &str,
        max_onboarding_blocks: Count,
        load_timeout_steps: U64,
    ) -> PyResult<Self> {
        let groups = kv_groups(model, groups, block_size.0)?;
        let tiers = crate::transfers::tiers_config(
            host_blocks,
            disk_blocks,
            offload,
            max_onboarding_blocks,
            load_timeout_steps,
        )?;
        let manager = crate::pool::manager(
            num_blocks.0,
            block_size.0,
            crate::args::eviction(eviction)?.policy(),
            kvbm_blocks::DuplicatePolicy::Deduplicate,
        )?;
        let mut config = SchedulerConfig::default()
            .with_max_running(max_running.0)
            .with_token_budget(token_budget.0)
            .with_chunk_size(chunk_size.0)
            .with_prefix_credit(prefix_credit)
            .with_speculative_tokens(speculative_tokens.0);
        if let Some(watermark) = watermark_blocks {
            config = config.with_watermark_blocks(watermark.0);
        }
        if let Some(value) = reserve {
            config = config.with_reserve(self::reserve(value)?);
        }
        config = match preemption.trim().to_ascii_lowercase().as_str() {
            "never" => config.with_preemption(Preemption::Never),
            "priority" | "by-priority" | "by_priority" => {
                config.with_preemption(Preemption::ByPriority)
            }
            _ => {
                return Err(Error::invalid(format!(
                    "unknown preemption `{preemption}`: expected \"never\" or \"priority\""
                ))
                .into());
            }
        };
        let events = events.then(|| manager.subscribe_events(1024));
        // No lower tier is `with_tiers` of none, which is `new` (and
        // `with_kv_groups_and_tiers` of none is `with_kv_groups`).
        let tiers = tiers.unwrap_or_default();
        let mut scheduler = match groups {
            Some(groups) => {
                RustScheduler::with_kv_groups_and_tiers(manager.clone(), config, groups, tiers)
            }
            None => RustScheduler::with_tiers(manager.clone(), config, tiers),
        }
        .map_err(Error::from)?;
        // No recorder is installed from Python: skip the reads metrics need.
        scheduler.set_metrics_enabled(false);
        Ok(Self {
            handle: scheduler.submit_handle(),
            manager,
            state: Mutex::new(State { scheduler, events }),
        })
    }

    /// Queues a request: ``prompt`` token ids, up to ``max_new_tokens`` to
    /// generate. ``priority`` is ``"low"``, ``"normal"``, ``"high"`` or
    /// ``"critical"``; ``salt`` (str or bytes) keeps its cache entries apart
    /// from other salts'. Raises ``SchedulerError`` for an id already live
    /// or a request larger than the whole pool, ``InvalidArgumentError``
    /// for an empty prompt. Any thread may call it, even during a step.
    #[pyo3(
        signature = (request_id, prompt, max_new_tokens, *, priority = "normal", salt = SaltArg::default()),
        text_signature = "($self, request_id, prompt, max_new_tokens, *, priority='normal', salt=None)"
    )]
    fn submit(
        &self,
        request_id: U64,
        prompt: Tokens,
        max_new_tokens: crate::args::U32,
        priority: &str,
        salt: SaltArg,
    ) -> PyResult<()> {
        let request = InferenceRequest::new(RequestId(request_id.0), prompt.0, max_new_tokens.0)
            .with_priority(self::priority(priority)?)
            .with_salt(salt.0);
        self.handle
            .submit(request)
            .map_err(|rejected| Error::from(rejected.error().clone()))?;
        Ok(())
    }

    /// Ends a request wherever it is; it is reported finished
    /// (``"cancelled"``) by the next ``step`` or ``apply``. Returns whether
    /// it was live. Any thread may call it.
    fn cancel(&self, request_id: U64) -> bool {
        self.handle.cancel(RequestId(request_id.0))
    }

    /// Takes a request out at once, wherever it is, and returns how it
    /// finished (``"aborted"``). Raises ``SchedulerError`` if it is neither
    /// waiting nor running.
    fn abort(&self, py: Python<'_>, request_id: U64) -> PyResult<Finished> {
        let mut state = lock(&self.state, py);
        let finished = state
            .scheduler
            .abort(RequestId(request_id.0))
            .map_err(Error::from)?;
        Ok(Finished::from(&finished))
    }

    /// Plans the next engine step. Raises ``SchedulerError`` if the last
    /// plan was not applied yet.
    fn step(&self, py: Python<'_>) -> PyResult<StepPlan> {
        let mut guard = lock(&self.state, py);
        let state = &mut *guard;
        let census = state.scheduler.census();
        let plan = if census.running + census.waiting >= DETACH_REQUESTS {
            py.detach(|| state.scheduler.step())
        } else {
            state.scheduler.step()
        };
        Ok(StepPlan::new(plan.map_err(Error::from)?))
    }

    /// Commits what the engine sampled for the pending plan: ``outputs``
    /// maps each scheduled request id to its sampled token (an int),
    /// ``None`` for a prefill chunk that samples nothing, or, after a
    /// speculative step, a list of the accepted draft tokens followed by
    /// the sampled one. ``stop`` lists requests that hit a stop condition
    /// with this token. Raises ``SchedulerError`` (nothing changes) for a
    /// missing, extra or malformed output.
    #[pyo3(signature = (outputs, *, stop = None))]
    fn apply(
        &self,
        py: Python<'_>,
        outputs: &Bound<'_, PyDict>,
        stop: Option<Vec<U64>>,
    ) -> PyResult<StepReport> {
        let stop: std::collections::HashSet<u64> = stop
            .unwrap_or_default()
            .into_iter()
            .map(|id| id.0)
            .collect();
        let mut engine = Vec::with_capacity(outputs.len());
        for (key, value) in outputs.iter() {
            let U64(id) = key.extract()?;
            engine.push(output(id, &value, stop.contains(&id))?);
        }
        if let Some(&missing) = stop
            .iter()
            .find(|id| !outputs.contains(**id).unwrap_or(false))
        {
            return Err(Error::invalid(format!(
                "stop names request {missing}, which has no output"
            ))
            .into());
        }
        let mut guard = lock(&self.state, py);
        let state = &mut *guard;
        let report = if engine.len() as u64 >= DETACH_REQUESTS {
            py.detach(|| state.scheduler.apply(&engine))
        } else {
            state.scheduler.apply(&engine)
        };
        Ok(StepReport::new(report.map_err(Error::from)?))
    }

    /// For simulators: runs up to ``max_steps`` steps at once while each
    /// is every running request decoding one token inside the blocks it
    /// holds, each sampling ``token``, with exactly the effects of as many
    /// ``step()`` + ``apply()`` pairs; it stops before the first step that
    /// would do more (admit, allocate, complete a block, finish a request)
    /// and runs none while anything waits, a plan is pending, or tiers or
    /// speculative decoding are configured. Returns ``(steps, requests)``:
    /// the steps run and the requests that decoded in each. A token is one
    /// int for every decode: an engine whose tokens matter samples them
    /// through ``step()`` and ``apply()``.
    #[pyo3(signature = (max_steps, *, token = U32(0)))]
    fn run_decodes_in_place(&self, py: Python<'_>, max_steps: U64, token: U32) -> (u64, usize) {
        let mut guard = lock(&self.state, py);
        let state = &mut *guard;
        let ran =
            py.detach(|| (state.scheduler).run_decodes_in_place(max_steps.0, |_, _| Some(token.0)));
        (ran.steps, ran.requests)
    }

    /// Whether nothing is waiting or running and every request was
    /// reported finished.
    #[getter]
    fn is_idle(&self, py: Python<'_>) -> bool {
        lock(&self.state, py).scheduler.is_idle()
    }

    /// Whether request ``request_id`` is running (admitted, holding blocks).
    fn is_running(&self, py: Python<'_>, request_id: U64) -> bool {
        lock(&self.state, py)
            .scheduler
            .is_running(RequestId(request_id.0))
    }

    /// Ids of the running requests.
    #[getter]
    fn running_ids(&self, py: Python<'_>) -> Vec<u64> {
        let state = lock(&self.state, py);
        state.scheduler.running_ids().map(|id| id.0).collect()
    }

    /// The block table of a running request (``None`` if it is not running).
    fn block_table(&self, py: Python<'_>, request_id: U64) -> Option<Vec<u32>> {
        let table = lock(&self.state, py)
            .scheduler
            .block_table(RequestId(request_id.0))?;
        Some(table.into_iter().map(|id| id.get()).collect())
    }

    /// Reports the engine's transfers (``StepPlan.transfers``): the ids in
    /// ``completed`` copied every block, those in ``failed`` did not (none
    /// of their blocks count; a request waiting for a failed load computes
    /// its prefix instead). All or nothing: an id never planned, already
    /// reported or given twice raises ``SchedulerError`` and nothing
    /// changes. Any time, between steps or while a step runs.
    #[pyo3(signature = (completed = Vec::new(), failed = Vec::new()))]
    fn report_transfers(
        &self,
        py: Python<'_>,
        completed: Vec<U64>,
        failed: Vec<U64>,
    ) -> PyResult<()> {
        let reports = crate::transfers::reports(&completed, &failed);
        lock(&self.state, py)
            .scheduler
            .report_transfers(&reports)
            .map_err(Error::from)?;
        Ok(())
    }

    /// Transfers planned since the last ``step`` (the stores of blocks the
    /// last ``apply`` registered), for an engine that starts them at once
    /// rather than with the next plan.
    fn take_transfers(&self, py: Python<'_>) -> Vec<crate::transfers::Transfer> {
        let mut transfers = Vec::new();
        lock(&self.state, py)
            .scheduler
            .take_transfers(&mut transfers);
        (transfers.iter())
            .map(crate::transfers::Transfer::from)
            .collect()
    }

    /// Transfers planned and not yet reported.
    #[getter]
    fn transfers_in_flight(&self, py: Python<'_>) -> usize {
        lock(&self.state, py).scheduler.transfers_in_flight()
    }

    /// What onboarding did, as a dict: ``requests`` that waited for loads,
    /// the ``blocks`` they waited for, ``loaded_from`` (blocks planned per
    /// lower tier, host first), ``timeouts``, ``stall_steps`` and
    /// ``declined`` (prefixes the cost model chose to recompute).
    fn onboard_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = lock(&self.state, py).scheduler.onboard_stats();
        let dict = PyDict::new(py);
        dict.set_item("requests", stats.requests)?;
        dict.set_item("blocks", stats.blocks)?;
        dict.set_item(
            "loaded_from",
            stats.loaded_from.get(1..3).unwrap_or_default(),
        )?;
        dict.set_item("timeouts", stats.timeouts)?;
        dict.set_item("stall_steps", stats.stall_steps)?;
        dict.set_item("declined", stats.declined)?;
        Ok(dict)
    }

    /// The pending step's slot mapping (vLLM's ``slot_mapping``) in KV
    /// cache group ``group``: the KV slot (``block id × block size +
    /// offset``) of every token ``plan`` computes, in the plan's order
    /// (prefill chunks, then decodes), as an ``array.array('q')`` of
    /// int64 (``numpy.frombuffer`` and ``torch.frombuffer`` take it without
    /// a copy). A token of a request that left after planning, or of a
    /// group the model does not have, gets -1 (vLLM's ``PAD_SLOT_ID``).
    /// Raises ``SchedulerError`` unless ``plan`` is the step awaiting
    /// ``apply``.
    #[pyo3(signature = (plan, group = Count(0)))]
    fn slot_mapping<'py>(
        &self,
        py: Python<'py>,
        plan: &StepPlan,
        group: Count,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut slots = Vec::new();
        lock(&self.state, py)
            .scheduler
            .group_slot_mapping(plan.inner(), group.0, &mut slots)
            .map_err(Error::from)?;
        let len = slots
            .len()
            .checked_mul(8)
            .ok_or_else(|| Error::invalid("slot mapping too large"))?;
        let bytes = PyBytes::new_with(py, len, |buffer| {
            for (out, &slot) in buffer.chunks_exact_mut(8).zip(&slots) {
                let slot = match slot {
                    PAD_SLOT => -1,
                    // A slot is a block id times the block size plus an
                    // offset: far below 2^63.
                    slot => i64::try_from(slot).unwrap_or(-1),
                };
                out.copy_from_slice(&slot.to_ne_bytes());
            }
            Ok(())
        })?;
        ARRAY.import(py, "array", "array")?.call1(("q", bytes))
    }

    /// KV cache group ``group``'s table of a running request, as
    /// ``(first_block, blocks)``: the index of the first block it still
    /// holds (a sliding window's earlier blocks went back to the cache) and
    /// the blocks from there on. ``None`` if it is not running or there is
    /// no such group (a one-group scheduler has group 0 only).
    fn group_block_table(
        &self,
        py: Python<'_>,
        request_id: U64,
        group: Count,
    ) -> Option<(usize, Vec<u32>)> {
        let (first, table) = lock(&self.state, py)
            .scheduler
            .group_block_table(RequestId(request_id.0), group.0)?;
        Some((first, table.into_iter().map(|id| id.get()).collect()))
    }

    /// Blocks the running requests hold, per KV cache group (one entry for
    /// a one-group scheduler).
    fn held_blocks_by_group(&self, py: Python<'_>) -> Vec<usize> {
        lock(&self.state, py).scheduler.held_blocks_by_group()
    }

    /// The KV cache groups, as ``(kind, span, layers)`` tuples (``span``
    /// is a window or chunk in tokens, ``None`` for full attention);
    /// ``None`` for a one-group scheduler.
    #[getter]
    fn kv_groups(&self, py: Python<'_>) -> Option<Vec<(&'static str, Option<usize>, usize)>> {
        let state = lock(&self.state, py);
        let groups = state.scheduler.kv_groups()?;
        Some(
            (groups.groups().iter())
                .map(|group| (group.kind().name(), group.kind().span(), group.layers()))
                .collect(),
        )
    }

    /// The tokens (prompt and generated) of a running request.
    fn tokens(&self, py: Python<'_>, request_id: U64) -> Option<Vec<u32>> {
        let state = lock(&self.state, py);
        state
            .scheduler
            .tokens(RequestId(request_id.0))
            .map(|tokens| tokens.to_vec())
    }

    /// Where every request is, and the lifetime counters, as a dict
    /// (``submitted == waiting + onboarding + running + finished + aborted``).
    fn census<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let census = lock(&self.state, py).scheduler.census();
        census_dict(py, &census)
    }

    /// The scheduler's gauges and counters under vLLM's metric names:
    /// ``kv_cache_usage``, ``num_requests_running``, ``num_requests_waiting``,
    /// ``prefix_cache_queries``, ``prefix_cache_hits``, ``num_preemptions``,
    /// ``generation_tokens``, ``evictions``.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let census = lock(&self.state, py).scheduler.census();
        let pool = self.manager.metrics();
        let dict = PyDict::new(py);
        dict.set_item("kv_cache_usage", convert::usage(&pool))?;
        dict.set_item("num_requests_running", census.running)?;
        dict.set_item("num_requests_waiting", census.waiting)?;
        dict.set_item("prefix_cache_queries", census.prefix_cache_queries)?;
        dict.set_item("prefix_cache_hits", census.prefix_cache_hits)?;
        dict.set_item("num_preemptions", census.preemptions)?;
        dict.set_item("generation_tokens", census.generated_tokens)?;
        dict.set_item("evictions", pool.evictions)?;
        Ok(dict)
    }

    /// The pool's occupancy and counters (as ``BlockPool.metrics``).
    fn pool_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        convert::pool_metrics(py, &self.manager.metrics())
    }

    /// Checks both conservation laws (every request in one place, every
    /// block in use held by a running request) and returns the census.
    /// O(blocks); raises ``SchedulerError`` on a discrepancy (a kvbm bug).
    fn audit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let census = lock(&self.state, py)
            .scheduler
            .audit()
            .map_err(Error::from)?;
        census_dict(py, &census)
    }

    /// The pool's cache events since the last call (see
    /// ``BlockPool.take_events``); needs ``events=True``.
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let messages = {
            let state = lock(&self.state, py);
            let Some(events) = &state.events else {
                return Err(Error::new(
                    crate::errors::Kind::Scheduler,
                    "this scheduler records no events: build it with events=True",
                )
                .into());
            };
            events.drain()
        };
        convert::events(py, &messages)
    }

    /// Blocks in the pool.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.manager.total_blocks()
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.manager.block_size()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let census = lock(&self.state, py).scheduler.census();
        format!(
            "Scheduler(num_blocks={}, block_size={}, waiting={}, running={}, finished={})",
            self.manager.total_blocks(),
            self.manager.block_size(),
            census.waiting,
            census.running,
            census.finished
        )
    }
}

fn census_dict<'py>(py: Python<'py>, census: &kvbm_queue::Census) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("submitted", census.submitted)?;
    dict.set_item("waiting", census.waiting)?;
    dict.set_item("onboarding", census.onboarding)?;
    dict.set_item("running", census.running)?;
    dict.set_item("finished", census.finished)?;
    dict.set_item("aborted", census.aborted)?;
    dict.set_item("preemptions", census.preemptions)?;
    dict.set_item("priority_preemptions", census.priority_preemptions)?;
    dict.set_item("prompt_tokens", census.prompt_tokens)?;
    dict.set_item("prefix_hit_tokens", census.prefix_hit_tokens)?;
    dict.set_item("prefix_cache_queries", census.prefix_cache_queries)?;
    dict.set_item("prefix_cache_hits", census.prefix_cache_hits)?;
    dict.set_item("generated_tokens", census.generated_tokens)?;
    dict.set_item("spec_proposed_tokens", census.spec_proposed_tokens)?;
    dict.set_item("spec_accepted_tokens", census.spec_accepted_tokens)?;
    Ok(dict)
}
