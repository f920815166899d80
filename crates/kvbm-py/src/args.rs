//! Arguments from Python: counts, token lists, hash lists and names, each
//! refused with `InvalidArgumentError` (a `ValueError`) when out of range and
//! `TypeError` when of the wrong type, never a panic.

use std::str::FromStr;

use kvbm_blocks::{DuplicatePolicy, SequenceHash};
use kvbm_queue::Priority;
use kvbm_sequence::Salt;
use kvbm_sim::Eviction;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString};

use crate::errors::Error;
use crate::sequence::{RequestSequence, Sequence};

/// A non-negative Python `int` that fits a `usize` (a count or size).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Count(pub(crate) usize);

/// A non-negative Python `int` that fits a `u64` (a request id).
#[derive(Clone, Copy, Debug)]
pub(crate) struct U64(pub(crate) u64);

/// A non-negative Python `int` that fits a `u32` (a token, a block id).
#[derive(Clone, Copy, Debug)]
pub(crate) struct U32(pub(crate) u32);

/// Why an `int` did not convert: negative or too large (a non-int keeps
/// its `TypeError`).
fn refine(obj: Borrowed<'_, '_, PyAny>, err: PyErr, max: &str) -> PyErr {
    if !obj.is_instance_of::<PyInt>() {
        return err;
    }
    let text = obj.repr().map(|r| r.to_string()).unwrap_or_default();
    match obj.lt(0) {
        Ok(true) => Error::invalid(format!("{text} is negative")).into(),
        Ok(false) => Error::invalid(format!("{text} is too large (at most {max})")).into(),
        Err(err) => err,
    }
}

macro_rules! bounded_int {
    ($name:ident, $ty:ty) => {
        impl FromPyObject<'_, '_> for $name {
            type Error = PyErr;

            fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
                match obj.extract::<$ty>() {
                    Ok(value) => Ok(Self(value)),
                    Err(err) => Err(refine(obj, err, &<$ty>::MAX.to_string())),
                }
            }
        }
    };
}

bounded_int!(Count, usize);
bounded_int!(U64, u64);
bounded_int!(U32, u32);

/// A list of token ids (`u32`): a list, any iterable of ints, or a buffer
/// of 4-byte unsigned ints (`array.array('I')`, a `numpy.uint32` array),
/// the last copied at memory speed.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tokens(pub(crate) Vec<u32>);

impl FromPyObject<'_, '_> for Tokens {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
            return Err(PyTypeError::new_err(
                "tokens must be a list of ints, not str or bytes",
            ));
        }
        if let Ok(list) = obj.cast::<PyList>() {
            let mut tokens = Vec::with_capacity(list.len());
            for item in list.iter() {
                tokens.push(token(item.as_borrowed())?);
            }
            return Ok(Self(tokens));
        }
        if let Ok(buffer) = PyBuffer::<u32>::get(&obj) {
            return Ok(Self(buffer.to_vec(py)?));
        }
        let mut tokens = Vec::with_capacity(obj.len().unwrap_or(0));
        for item in obj.try_iter()? {
            tokens.push(token(item?.as_borrowed())?);
        }
        Ok(Self(tokens))
    }
}

fn token(item: Borrowed<'_, '_, PyAny>) -> PyResult<u32> {
    match item.extract::<u32>() {
        Ok(token) => Ok(token),
        Err(err) if err.is_instance_of::<PyOverflowError>(item.py()) => {
            Err(refine(item, err, &u32::MAX.to_string()))
        }
        Err(err) => Err(err),
    }
}

/// Chained block hashes: a [`Sequence`] or [`RequestSequence`] (its hashes
/// as they are), `bytes` of packed 16-byte little-endian values, or an
/// iterable of `int` values in `0..2**128`.
#[derive(Clone, Debug)]
pub(crate) enum Hashes {
    /// Whole hashes, with their parents and positions.
    Chain(Vec<SequenceHash>),
    /// Bare values, chained by position.
    Values(Vec<u128>),
}

impl FromPyObject<'_, '_> for Hashes {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        if let Ok(sequence) = obj.cast::<Sequence>() {
            return Ok(Self::Chain(sequence.get().sequence_hashes(py)));
        }
        if let Ok(request) = obj.cast::<RequestSequence>() {
            return Ok(Self::Chain(request.get().sequence_hashes(py)));
        }
        if let Ok(bytes) = obj.cast::<PyBytes>() {
            return unpack(bytes.as_bytes()).map(Self::Values);
        }
        if obj.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "hashes must be ints, packed bytes or a Sequence, not str",
            ));
        }
        let mut values = Vec::with_capacity(obj.len().unwrap_or(0));
        for item in obj.try_iter()? {
            let item = item?;
            match item.extract::<u128>() {
                Ok(value) => values.push(value),
                Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
                    let text = item.repr().map(|r| r.to_string()).unwrap_or_default();
                    return Err(
                        Error::invalid(format!("hash value {text} is outside 0..2**128")).into(),
                    );
                }
                Err(err) => return Err(err),
            }
        }
        Ok(Self::Values(values))
    }
}

/// Hash values packed as 16-byte little-endian integers.
fn unpack(bytes: &[u8]) -> PyResult<Vec<u128>> {
    let chunks = bytes.chunks_exact(16);
    if !chunks.remainder().is_empty() {
        return Err(Error::invalid(format!(
            "packed hashes are 16 bytes each, got {} bytes",
            bytes.len()
        ))
        .into());
    }
    Ok(chunks
        .map(|chunk| {
            let mut value = [0; 16];
            value.copy_from_slice(chunk);
            u128::from_le_bytes(value)
        })
        .collect())
}

/// Hash values packed as 16-byte little-endian integers.
pub(crate) fn pack(values: impl ExactSizeIterator<Item = u128>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(values.len() * 16);
    for value in values {
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    bytes
}

impl Hashes {
    /// `count` hashes from `position` on: bare values chained onto `parent`
    /// (a root at position 0 has none), or a sequence's own hashes
    /// `position..position + count` (`parent` must then be absent).
    ///
    /// `count` `None` takes all of them.
    pub(crate) fn chain(
        self,
        parent: Option<u128>,
        position: Option<u32>,
        count: Option<usize>,
    ) -> Result<Vec<SequenceHash>, Error> {
        match self {
            Self::Chain(hashes) => {
                if parent.is_some() {
                    return Err(Error::invalid(
                        "a sequence's hashes carry their parents: give no parent",
                    ));
                }
                let mut hashes = hashes;
                let start = position.unwrap_or(0) as usize;
                let count = count.unwrap_or(hashes.len().saturating_sub(start));
                let end = start.saturating_add(count);
                if end > hashes.len() {
                    return Err(Error::invalid(format!(
                        "hashes {start}..{end} asked of a sequence with {} full blocks",
                        hashes.len()
                    )));
                }
                hashes.truncate(end);
                hashes.drain(..start);
                Ok(hashes)
            }
            Self::Values(values) => {
                if let Some(count) = count
                    && count != values.len()
                {
                    return Err(Error::invalid(format!(
                        "{count} blocks but {} hashes",
                        values.len()
                    )));
                }
                let position = crate::pool::first_position(parent, position)?;
                chain_values(&values, parent, position)
            }
        }
    }
}

/// Bare values as a chain: the first at `position` under `parent`, each
/// next one its predecessor's child.
fn chain_values(
    values: &[u128],
    parent: Option<u128>,
    position: u32,
) -> Result<Vec<SequenceHash>, Error> {
    let mut hashes = Vec::with_capacity(values.len());
    let mut previous: Option<SequenceHash> = None;
    for &value in values {
        let hash = match previous {
            Some(previous) => previous.child(value),
            None => SequenceHash::from_parts(value, parent, position)?,
        };
        hashes.push(hash);
        previous = Some(hash);
    }
    Ok(hashes)
}

/// An eviction policy by its command-line name (`lru`, `multi-level`,
/// `lineage`).
pub(crate) fn eviction(name: &str) -> Result<Eviction, Error> {
    Ok(Eviction::from_str(name)?)
}

/// A duplicate policy by name (`deduplicate`, `allow`).
pub(crate) fn duplicates(name: &str) -> Result<DuplicatePolicy, Error> {
    match name.trim().to_ascii_lowercase().as_str() {
        "deduplicate" | "dedup" => Ok(DuplicatePolicy::Deduplicate),
        "allow" => Ok(DuplicatePolicy::Allow),
        _ => Err(Error::invalid(format!(
            "unknown duplicate policy `{name}`: expected `deduplicate` or `allow`"
        ))),
    }
}

/// A priority by name (`low`, `normal`, `high`, `critical`).
pub(crate) fn priority(name: &str) -> Result<Priority, Error> {
    let wanted = name.trim().to_ascii_lowercase();
    Priority::ALL
        .into_iter()
        .find(|priority| priority.name() == wanted)
        .ok_or_else(|| {
            Error::invalid(format!(
                "unknown priority `{name}`: expected low, normal, high or critical"
            ))
        })
}

/// A salt from a `str` (its UTF-8) or `bytes`; none for `None`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SaltArg(pub(crate) Salt);

impl FromPyObject<'_, '_> for SaltArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        if obj.is_none() {
            return Ok(Self(Salt::NONE));
        }
        if let Ok(text) = obj.cast::<PyString>() {
            return Ok(Self(Salt::from_bytes(text.to_str()?.as_bytes())));
        }
        if let Ok(bytes) = obj.cast::<PyBytes>() {
            return Ok(Self(Salt::from_bytes(bytes.as_bytes())));
        }
        Err(PyTypeError::new_err("a salt is a str, bytes or None"))
    }
}
