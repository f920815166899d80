//! The simulator's replays: `kvbm.Trace` and `replay_cache`, `replay_serve`,
//! `replay_cluster`, each returning the report `kvbm-sim <mode> --json`
//! prints, as a dict, with the GIL released while it runs.
//!
//! The options are the command line's flags in snake case, with its
//! defaults (kvbm-sim's `cli.rs` maps them the same way).

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvbm_queue::{Aging, GenerationReserve, Preemption, SchedulerConfig};
use kvbm_sim::{
    CacheConfig, CacheTiers, Capacity, ClusterConfig, DataPlaneSpec, KvFlags, KvSetup, Link,
    NoProgress, Offload, PolicyKind, PriorityMix, ServeConfig, SimError as RustSimError, StepTime,
    TierSetup, Trace as RustTrace, TraceRequest, Workload,
};
use pyo3::exceptions::{PyKeyError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use serde_json::Value;

use crate::args::{Count, U32, U64};
use crate::convert;
use crate::errors::Error;

/// Where the embedded excerpt comes from, as the command line names it.
const EXCERPT_SOURCE: &str = "embedded excerpt of the Mooncake conversation trace";

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// A request trace in the Mooncake format (JSONL: per request an arrival
/// ``timestamp`` in ms, ``input_length``, ``output_length`` and one
/// ``hash_ids`` entry per 512-token prompt block), parsed and checked once
/// for any number of replays.
#[pyclass(module = "kvbm", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct Trace {
    trace: Arc<RustTrace>,
    source: String,
    load_ms: f64,
}

impl Trace {
    fn timed(
        source: String,
        load: impl FnOnce() -> Result<RustTrace, RustSimError>,
    ) -> PyResult<Self> {
        let started = Instant::now();
        let trace = load().map_err(Error::from)?;
        Ok(Self {
            trace: Arc::new(trace),
            source,
            load_ms: millis(started.elapsed()),
        })
    }

    /// A trace argument: a `Trace`, a path (`str` or `os.PathLike`), a list
    /// of request dicts, or `None` for the embedded excerpt.
    fn from_arg(py: Python<'_>, trace: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let Some(trace) = trace.filter(|t| !t.is_none()) else {
            return Self::excerpt();
        };
        if let Ok(trace) = trace.cast::<Trace>() {
            return Ok(trace.get().clone());
        }
        if let Ok(list) = trace.cast::<PyList>() {
            return Self::from_requests(list);
        }
        match trace.extract::<PathBuf>() {
            Ok(path) => Self::load(py, path),
            Err(_) => Err(PyTypeError::new_err(
                "trace must be a kvbm.Trace, a path, a list of request dicts or None",
            )),
        }
    }

    /// This trace cut to its first `limit` requests.
    fn limited(&self, limit: Option<Count>) -> PyResult<Arc<RustTrace>> {
        match limit {
            None => Ok(self.trace.clone()),
            Some(Count(limit)) => {
                let limit = NonZeroUsize::new(limit)
                    .ok_or_else(|| Error::invalid("limit must be at least 1"))?;
                let mut trace = RustTrace::clone(&self.trace);
                trace.truncate(limit);
                Ok(Arc::new(trace))
            }
        }
    }

    /// A report's JSON with where its trace came from and how long loading
    /// took, as the command line adds them.
    fn annotate(&self, mut json: Value) -> Value {
        if let Some(object) = json.as_object_mut() {
            object.insert("trace".to_owned(), self.source.clone().into());
            object.insert("load_ms".to_owned(), self.load_ms.into());
        }
        json
    }
}

/// The field `key` of request dict number `index`, if present and not `None`.
fn field<'py, T>(request: &Bound<'py, PyAny>, index: usize, key: &str) -> PyResult<Option<T>>
where
    T: for<'a> FromPyObject<'a, 'py, Error = PyErr>,
{
    let py = request.py();
    let value = match request.get_item(key) {
        Ok(value) => value,
        Err(err) if err.is_instance_of::<PyKeyError>(py) => return Ok(None),
        Err(err) => return Err(err),
    };
    if value.is_none() {
        return Ok(None);
    }
    value.extract::<T>().map(Some).map_err(|err: PyErr| {
        let message = format!("request {index}: {key}: {}", err.value(py));
        if err.is_instance_of::<PyTypeError>(py) {
            PyTypeError::new_err(message)
        } else {
            Error::invalid(message).into()
        }
    })
}

#[pymethods]
impl Trace {
    /// The embedded excerpt of the Mooncake conversation trace (500
    /// requests), what every replay uses by default.
    #[staticmethod]
    fn excerpt() -> PyResult<Self> {
        Self::timed(EXCERPT_SOURCE.to_owned(), RustTrace::conversation_excerpt)
    }

    /// Reads and checks a JSONL trace file (``str`` or ``os.PathLike``).
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let source = path.display().to_string();
        py.detach(|| {
            let started = Instant::now();
            RustTrace::from_path(&path).map(|trace| (trace, started.elapsed()))
        })
        .map(|(trace, took)| Self {
            trace: Arc::new(trace),
            source,
            load_ms: millis(took),
        })
        .map_err(|err| Error::from(err).into())
    }

    /// Parses JSONL text, one request per line.
    #[staticmethod]
    fn from_jsonl(text: &str) -> PyResult<Self> {
        Self::timed("JSONL text".to_owned(), || RustTrace::from_jsonl(text))
    }

    /// Requests as dicts with ``timestamp``, ``input_length``,
    /// ``output_length``, ``hash_ids`` and optionally ``priority`` (vLLM's,
    /// lower is more urgent).
    #[staticmethod]
    fn from_requests(requests: &Bound<'_, PyList>) -> PyResult<Self> {
        let started = Instant::now();
        let mut parsed = Vec::with_capacity(requests.len());
        for (index, request) in requests.iter().enumerate() {
            let index = index + 1;
            let missing = |key: &str| Error::invalid(format!("request {index} has no {key}"));
            let required = |key: &str| -> PyResult<u64> {
                match field::<U64>(&request, index, key)? {
                    Some(value) => Ok(value.0),
                    None => Err(missing(key).into()),
                }
            };
            let hash_ids = match field::<Vec<U64>>(&request, index, "hash_ids")? {
                Some(ids) => ids.into_iter().map(|id| id.0).collect(),
                None => return Err(missing("hash_ids").into()),
            };
            parsed.push(TraceRequest {
                timestamp: required("timestamp")?,
                input_length: required("input_length")?,
                output_length: required("output_length")?,
                hash_ids,
                priority: field::<i64>(&request, index, "priority")?,
            });
        }
        let trace = RustTrace::from_requests(parsed).map_err(Error::from)?;
        Ok(Self {
            source: format!("{} requests from Python", trace.len()),
            trace: Arc::new(trace),
            load_ms: millis(started.elapsed()),
        })
    }

    /// Where the trace came from.
    #[getter]
    fn source(&self) -> &str {
        &self.source
    }

    /// Requests, input and output tokens, 512-token blocks and duration.
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let summary = self.trace.summary();
        let dict = PyDict::new(py);
        dict.set_item("requests", summary.requests)?;
        dict.set_item("input_tokens", summary.input_tokens)?;
        dict.set_item("output_tokens", summary.output_tokens)?;
        dict.set_item("trace_blocks", summary.trace_blocks)?;
        dict.set_item("duration_ms", summary.duration_ms)?;
        dict.set_item("mean_input_tokens", summary.mean_input_tokens())?;
        dict.set_item("mean_output_tokens", summary.mean_output_tokens())?;
        Ok(dict)
    }

    /// The requests as dicts (the trace lines' fields).
    fn requests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for request in self.trace.requests() {
            let dict = PyDict::new(py);
            dict.set_item("timestamp", request.timestamp)?;
            dict.set_item("input_length", request.input_length)?;
            dict.set_item("output_length", request.output_length)?;
            dict.set_item("hash_ids", &request.hash_ids)?;
            if let Some(priority) = request.priority {
                dict.set_item("priority", priority)?;
            }
            list.append(dict)?;
        }
        Ok(list)
    }

    fn __len__(&self) -> usize {
        self.trace.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Trace({} requests, source={:?})",
            self.trace.len(),
            self.source
        )
    }
}

/// Keyword options, taken one by one; what is left is an unknown keyword.
struct Options<'py> {
    function: &'static str,
    dict: Option<Bound<'py, PyDict>>,
}

impl<'py> Options<'py> {
    fn new(function: &'static str, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        // A copy: the caller's dict is not ours to empty.
        let dict = kwargs.map(|kwargs| kwargs.copy()).transpose()?;
        Ok(Self { function, dict })
    }

    /// The option `key`, if given and not `None`.
    fn take<T>(&self, key: &str) -> PyResult<Option<T>>
    where
        T: for<'a> FromPyObject<'a, 'py, Error = PyErr>,
    {
        let Some(dict) = &self.dict else {
            return Ok(None);
        };
        let Some(value) = dict.get_item(key)? else {
            return Ok(None);
        };
        dict.del_item(key)?;
        if value.is_none() {
            return Ok(None);
        }
        let py = dict.py();
        value.extract::<T>().map(Some).map_err(|err: PyErr| {
            let message = format!("{}() option {key}: {}", self.function, err.value(py));
            if err.is_instance_of::<PyTypeError>(py) {
                PyTypeError::new_err(message)
            } else {
                Error::invalid(message).into()
            }
        })
    }

    /// The option `key` as it was given, if given and not `None`.
    fn take_any(&self, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(dict) = &self.dict else {
            return Ok(None);
        };
        let value = dict.get_item(key)?;
        if value.is_some() {
            dict.del_item(key)?;
        }
        Ok(value.filter(|value| !value.is_none()))
    }

    /// Whether the option `key` is given (and not `None`), without taking it.
    fn given(&self, key: &str) -> PyResult<bool> {
        let Some(dict) = &self.dict else {
            return Ok(false);
        };
        Ok(dict.get_item(key)?.is_some_and(|value| !value.is_none()))
    }

    /// The option `key` as the command line's text: a `str` as given, an
    /// `int` written out (a byte count, say).
    fn take_text(&self, key: &str) -> PyResult<Option<String>> {
        let Some(value) = self.take_any(key)? else {
            return Ok(None);
        };
        if let Ok(text) = value.cast::<PyString>() {
            return Ok(Some(text.to_str()?.to_owned()));
        }
        match value.extract::<u64>() {
            Ok(number) => Ok(Some(number.to_string())),
            Err(_) => Err(PyTypeError::new_err(format!(
                "{}() option {key}: expected a non-negative int or a str, got {value}",
                self.function
            ))),
        }
    }

    /// The option `key`, or `default`.
    fn or<T>(&self, key: &str, default: T) -> PyResult<T>
    where
        T: for<'a> FromPyObject<'a, 'py, Error = PyErr>,
    {
        Ok(self.take(key)?.unwrap_or(default))
    }

    /// Refuses what no `take` asked for.
    fn finish(self) -> PyResult<()> {
        if let Some(dict) = &self.dict
            && let Some((key, _)) = dict.iter().next()
        {
            return Err(PyTypeError::new_err(format!(
                "{}() got an unexpected keyword argument {key}",
                self.function
            )));
        }
        Ok(())
    }
}

/// Either a capacity in blocks or one in tokens (not both).
fn capacity(options: &Options<'_>, default: Capacity) -> PyResult<Capacity> {
    let blocks = options.take::<U64>("capacity_blocks")?;
    let tokens = options.take::<U64>("capacity_tokens")?;
    match (blocks, tokens) {
        (Some(_), Some(_)) => {
            Err(Error::invalid("give capacity_blocks or capacity_tokens, not both").into())
        }
        (Some(blocks), None) => Ok(Capacity::Blocks(blocks.0)),
        (None, Some(tokens)) => Ok(Capacity::Tokens(tokens.0)),
        (None, None) => Ok(default),
    }
}

/// `"full"`, or a cap in tokens.
fn generation_reserve(options: &Options<'_>) -> PyResult<GenerationReserve> {
    let Some(value) = options.take_any("reserve")? else {
        return Ok(GenerationReserve::default());
    };
    if let Ok(text) = value.cast::<PyString>()
        && text.to_str()?.trim().eq_ignore_ascii_case("full")
    {
        return Ok(GenerationReserve::Full);
    }
    match value.extract::<U32>() {
        Ok(cap) => Ok(GenerationReserve::Capped(cap.0)),
        Err(_) => Err(Error::invalid(format!(
            "reserve {value} is neither \"full\" nor a token count"
        ))
        .into()),
    }
}

/// Time-based aging at `per_second` priority steps per second of waiting;
/// strict priority at 0 (the command line's `--aging-per-s`).
fn aging(per_second: f64) -> PyResult<Aging> {
    if !per_second.is_finite() || per_second < 0.0 {
        return Err(Error::from(RustSimError::InvalidAgingRate { value: per_second }).into());
    }
    if per_second == 0.0 {
        return Ok(Aging::Strict);
    }
    // Rates too small for a step to fit a `Duration` age nothing.
    let step = Duration::try_from_secs_f64(1.0 / per_second).unwrap_or(Duration::MAX);
    Ok(Aging::Timed { step })
}

/// The `offload` option.
fn offload(options: &Options<'_>) -> PyResult<Offload> {
    let name: String = options.or("offload", "write-through".to_owned())?;
    Ok(Offload::from_str(&name).map_err(Error::invalid)?)
}

/// Lower tiers' sizes and offload policy (cache mode's).
fn cache_tiers(options: &Options<'_>) -> PyResult<CacheTiers> {
    let mut tiers = CacheTiers::default().with_offload(offload(options)?);
    if let Some(tokens) = options.take::<U64>("host_tier_tokens")? {
        tiers = tiers.with_host_tokens(tokens.0);
    }
    if let Some(tokens) = options.take::<U64>("disk_tier_tokens")? {
        tiers = tiers.with_disk_tokens(tokens.0);
    }
    Ok(tiers)
}

/// The `eviction` option.
fn eviction(options: &Options<'_>) -> PyResult<kvbm_sim::Eviction> {
    let name: String = options.or("eviction", "lru".to_owned())?;
    Ok(crate::args::eviction(&name)?)
}

/// A model's KV layout from serve's options (`model`, `groups`,
/// `kv_bytes_per_token_layer`, `capacity_bytes`, `full_attention_only`;
/// the byte counts an int or the command line's text, e.g. `"40G"`),
/// checked as the command line checks its flags. Call before `engine`,
/// which takes the capacity options a model's bytes replace.
fn kv_setup(options: &Options<'_>) -> PyResult<Option<KvSetup>> {
    let sized_by = if options.given("capacity_blocks")? {
        Some("--capacity-blocks")
    } else if options.given("capacity_tokens")? {
        Some("--capacity-tokens")
    } else {
        None
    };
    let model = options.take::<String>("model")?;
    let groups = options.take::<String>("groups")?;
    let bytes = options.take_text("kv_bytes_per_token_layer")?;
    let capacity = options.take_text("capacity_bytes")?;
    let flags = KvFlags {
        model: model.as_deref(),
        groups: groups.as_deref(),
        kv_bytes_per_token_layer: bytes.as_deref(),
        capacity_bytes: capacity.as_deref(),
        full_attention_only: options.or("full_attention_only", false)?,
    };
    Ok(flags.setup(sized_by).map_err(Error::from)?)
}

/// One engine's configuration from serve's options (kvbm-sim's
/// `EngineArgs::config`).
fn engine(options: &Options<'_>) -> PyResult<ServeConfig> {
    let defaults = ServeConfig::default();
    let limits = SchedulerConfig::default();
    let block_size = options.or("block_size", Count(defaults.block_size))?.0;
    let capacity = capacity(options, defaults.capacity)?;
    let eviction = eviction(options)?;
    let mut scheduler = limits
        .with_max_running(options.or("max_running", Count(limits.max_running))?.0)
        .with_token_budget(options.or("token_budget", Count(limits.token_budget))?.0)
        .with_chunk_size(options.or("chunk_size", Count(limits.chunk_size))?.0)
        .with_reserve(generation_reserve(options)?)
        .with_prefix_credit(options.or("prefix_credit", true)?)
        .with_speculative_tokens(options.or("spec_tokens", Count(0))?.0)
        .with_aging(aging(options.or("aging_per_s", 0.0)?)?)
        .with_preemption_boost(options.or("preemption_boost", U32(0))?.0);
    if options.or("priority_preemption", false)? {
        scheduler = scheduler.with_preemption(Preemption::ByPriority);
    }
    if let Some(blocks) = options.take::<Count>("watermark_blocks")? {
        scheduler = scheduler.with_watermark_blocks(blocks.0);
    }
    let step_time = StepTime::from_millis(
        options.or("step_ms", 5.0)?,
        options.or("prefill_token_ms", 0.05)?,
        options.or("decode_request_ms", 0.1)?,
    )
    .map_err(Error::from)?;

    let tier_defaults = TierSetup::default();
    let mut tiers = tier_defaults.with_offload(offload(options)?);
    tiers.host_tokens = options.take::<U64>("host_tier_tokens")?.map(|t| t.0);
    tiers.disk_tokens = options.take::<U64>("disk_tier_tokens")?.map(|t| t.0);
    tiers.kv_bytes_per_token = options
        .or("kv_bytes_per_token", U64(tier_defaults.kv_bytes_per_token))?
        .0;
    tiers.host_link = Link {
        gbps: options.or("host_link_gbps", Link::PCIE5_X16.gbps)?,
        setup_us: options.or("host_link_setup_us", Link::PCIE5_X16.setup_us)?,
    };
    tiers.disk_link = Link {
        gbps: options.or("disk_link_gbps", Link::NVME_GEN4.gbps)?,
        setup_us: options.or("disk_link_setup_us", Link::NVME_GEN4.setup_us)?,
    };

    let mut config = ServeConfig::new(block_size, capacity)
        .with_eviction(eviction)
        .with_scheduler(scheduler)
        .with_step_time(step_time)
        .with_audit_every(options.or("audit_every", U64(0))?.0)
        .with_spec_accept(options.or("spec_accept", defaults.spec_accept)?)
        .with_seed(options.or("seed", U64(0))?.0)
        .with_tiers(tiers)
        // As the command line without an exporter: no metrics recorded.
        .with_metrics(false);
    config.validate().map_err(Error::from)?;
    if let Some(mix) = options.take::<String>("priorities")? {
        config = config.with_priorities(PriorityMix::parse(&mix).map_err(Error::from)?);
    }
    Ok(config)
}

/// [`engine`] with the model's KV layout, if the options give one
/// (`model` or `groups`, in `capacity_bytes`), checked as the command line
/// checks its flags: a model's blocks have their own bytes, so
/// `kv_bytes_per_token` does not go with one.
fn engine_with_model(options: &Options<'_>) -> PyResult<ServeConfig> {
    let kv = kv_setup(options)?;
    if kv.is_some() && options.given("kv_bytes_per_token")? {
        return Err(Error::from(RustSimError::ConflictingFlags {
            flag: "kv_bytes_per_token",
            other: "model or groups",
            reason: "a model's blocks have its own bytes (kv_bytes_per_token_layer)",
        })
        .into());
    }
    let config = engine(options)?;
    match kv {
        Some(kv) => Ok(config.with_checked_kv(kv).map_err(Error::from)?),
        None => Ok(config),
    }
}

/// Runs `replay` with the GIL released and returns its JSON as a dict.
fn run<'py>(
    py: Python<'py>,
    replay: impl FnOnce() -> Result<Value, RustSimError> + Send,
) -> PyResult<Bound<'py, PyAny>> {
    let json = py.detach(replay).map_err(Error::from)?;
    convert::json(py, &json)
}

/// Cache mode: the trace's requests one after another through a block pool
/// used as a prefix cache; the report of ``kvbm-sim cache --json``.
///
/// Options (the command line's flags, snake case): ``block_size`` (512),
/// ``capacity_blocks`` or ``capacity_tokens`` (default unbounded),
/// ``eviction`` (``"lru"``, ``"multi-level"``, ``"lineage"``),
/// ``host_tier_tokens``, ``disk_tier_tokens``, ``offload``
/// (``"write-through"``, ``"write-back"``, ``"selective:K"``).
#[pyfunction]
#[pyo3(signature = (trace = None, **options))]
pub(crate) fn replay_cache<'py>(
    py: Python<'py>,
    trace: Option<&Bound<'py, PyAny>>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let trace = Trace::from_arg(py, trace)?;
    let options = Options::new("replay_cache", options)?;
    let block_size = options.or("block_size", Count(512))?.0;
    let capacity = capacity(&options, Capacity::Unbounded)?;
    let eviction = eviction(&options)?;
    let tiers = cache_tiers(&options)?;
    options.finish()?;
    run(py, move || {
        let started = Instant::now();
        let workload = Workload::new(&trace.trace, block_size)?;
        let split = started.elapsed();
        let config = CacheConfig::new(capacity, eviction).with_tiers(tiers);
        let report = kvbm_sim::mode::cache::replay(&workload, &config, &mut NoProgress)?;
        let mut json = trace.annotate(report.to_json());
        if let Some(object) = json.as_object_mut() {
            object.insert("split_ms".to_owned(), millis(split).into());
        }
        Ok(json)
    })
}

/// Serve mode: the trace's requests arrive at their timestamps into the
/// continuous-batching scheduler, in simulated time; the report of
/// ``kvbm-sim serve --json`` (TTFT and TPOT percentiles, throughput,
/// preemptions, hit rates).
///
/// Options: ``limit`` (the first N requests), ``data_plane`` (``"host"``
/// or ``"disk:DIR"``) and every engine flag of the command line in snake
/// case: ``block_size`` (16), ``capacity_blocks`` / ``capacity_tokens``
/// (3M tokens), ``eviction``, ``max_running``, ``token_budget``,
/// ``chunk_size``, ``watermark_blocks``, ``reserve``, ``prefix_credit``,
/// ``spec_tokens``, ``spec_accept``, ``seed``, ``priorities``,
/// ``priority_preemption``, ``aging_per_s``, ``preemption_boost``,
/// ``step_ms``, ``prefill_token_ms``, ``decode_request_ms``,
/// ``audit_every``, ``host_tier_tokens``, ``disk_tier_tokens``,
/// ``offload``, ``kv_bytes_per_token``, ``host_link_gbps``,
/// ``host_link_setup_us``, ``disk_link_gbps``, ``disk_link_setup_us``.
/// A model's KV cache groups: ``model`` (``"gpt-oss-120b"``,
/// ``"gpt-oss-20b"``, ``"gemma-3-27b"``, ``"llama-3.1-8b"``,
/// ``"llama-4-scout"``) or ``groups`` (its layers by kind, e.g.
/// ``"sliding_window:128:18,full:18"``, with ``kv_bytes_per_token_layer``),
/// in ``capacity_bytes`` of KV memory (an int, or text such as ``"40G"``)
/// instead of ``capacity_blocks`` / ``capacity_tokens``;
/// ``full_attention_only`` treats every layer as full attention. The
/// report then has ``kv_groups`` and ``peak_kv_bytes``; tiers below the
/// GPU hold the model's blocks (``host_tier_tokens`` of its KV, moved
/// as real bytes with ``data_plane``), so ``kv_bytes_per_token`` does not
/// go with a model.
#[pyfunction]
#[pyo3(signature = (trace = None, **options))]
pub(crate) fn replay_serve<'py>(
    py: Python<'py>,
    trace: Option<&Bound<'py, PyAny>>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let trace = Trace::from_arg(py, trace)?;
    let options = Options::new("replay_serve", options)?;
    let replayed = trace.limited(options.take("limit")?)?;
    let data_plane = match options.take::<String>("data_plane")? {
        Some(spec) => Some(DataPlaneSpec::from_str(&spec).map_err(Error::from)?),
        None => None,
    };
    let config = engine_with_model(&options)?;
    options.finish()?;
    run(py, move || {
        let report = kvbm_sim::mode::serve::replay_with_data_plane(
            &replayed,
            &config,
            &mut NoProgress,
            None,
            data_plane.as_ref(),
        )?;
        Ok(trace.annotate(report.to_json()))
    })
}

/// Cluster mode: arrivals routed over ``engines`` serve-mode engines behind
/// a KV-aware router, once per routing policy; the report of
/// ``kvbm-sim cluster --json``.
///
/// Options: serve's, and ``engines`` (16), ``replicate`` (1), ``policies``
/// (a list or comma-separated names: ``"random"``, ``"round-robin"``,
/// ``"least-loaded"``, ``"kv-aware"``, ``"global-kv"``),
/// ``overlap_weight``, ``temperature``, ``threads``, ``memory_limit_gb``
/// (12), ``global_pool_tokens``, ``network_gbps``, ``network_setup_us``,
/// ``pool_only_for_global_kv``; engines of a model's KV cache groups as
/// ``replay_serve``'s (``model`` or ``groups``, ``capacity_bytes``).
#[pyfunction]
#[pyo3(signature = (trace = None, **options))]
pub(crate) fn replay_cluster<'py>(
    py: Python<'py>,
    trace: Option<&Bound<'py, PyAny>>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let trace = Trace::from_arg(py, trace)?;
    let options = Options::new("replay_cluster", options)?;
    let replayed = trace.limited(options.take("limit")?)?;
    let defaults = ClusterConfig::default();
    let engines = options.or("engines", Count(defaults.engines))?.0;
    let replicate = options.or("replicate", Count(defaults.replicate))?.0;
    let policies = match options.take_any("policies")? {
        None => defaults.policies.clone(),
        Some(value) => {
            let names: Vec<String> = match value.cast::<PyString>() {
                Ok(text) => (text.to_str()?.split(','))
                    .map(|name| name.trim().to_owned())
                    .collect(),
                Err(_) => value.extract()?,
            };
            (names.iter())
                .map(|name| PolicyKind::parse(name))
                .collect::<Result<Vec<_>, _>>()
                .map_err(Error::from)?
        }
    };
    let overlap_weight = options.or("overlap_weight", defaults.overlap_weight)?;
    let temperature = options.or("temperature", defaults.temperature)?;
    let threads = options.take::<Count>("threads")?.map(|t| t.0);
    let memory_limit_gb = options.or(
        "memory_limit_gb",
        ClusterConfig::DEFAULT_MEMORY_BUDGET as f64 / 1e9,
    )?;
    let global_pool_tokens = options.take::<U64>("global_pool_tokens")?.map(|t| t.0);
    let network = Link {
        gbps: options.or("network_gbps", Link::NETWORK_100G.gbps)?,
        setup_us: options.or("network_setup_us", Link::NETWORK_100G.setup_us)?,
    };
    let pool_only = options.or("pool_only_for_global_kv", false)?;
    let engine = engine_with_model(&options)?;
    options.finish()?;
    let mut config = ClusterConfig::new(engines, engine)
        .with_replicate(replicate)
        .with_policies(policies)
        .with_overlap_weight(overlap_weight)
        .with_temperature(temperature)
        .with_threads(threads)
        .with_network(network)
        .with_pool_only_for_global_kv(pool_only)
        .with_memory_limit_gb(memory_limit_gb)
        .map_err(Error::from)?;
    if let Some(tokens) = global_pool_tokens {
        config = config.with_global_pool_tokens(tokens);
    }
    config.validate().map_err(Error::from)?;
    run(py, move || {
        let report = kvbm_sim::mode::cluster::replay(&replayed, &config)?;
        Ok(trace.annotate(report.to_json()))
    })
}
