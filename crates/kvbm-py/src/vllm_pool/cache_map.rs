//! vLLM 0.33's `BlockHashToBlockMap`: key bytes (a block hash and its
//! group) to the blocks cached under them, several per key, the earliest
//! answering a lookup.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::FastMap;

/// The blocks cached under one key, earliest first.
#[derive(Debug)]
struct Entry {
    /// The key as Python holds it (hash bytes + 4-byte big-endian group id).
    key: Py<PyBytes>,
    ids: Vec<u32>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct CacheMap {
    entries: FastMap<Box<[u8]>, Entry>,
}

impl CacheMap {
    /// Keys that map to at least one block.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The earliest block cached under `key`.
    pub(super) fn first(&self, key: &[u8]) -> Option<u32> {
        self.entries.get(key).and_then(|e| e.ids.first().copied())
    }

    /// The blocks cached under `key`, earliest first.
    pub(super) fn ids(&self, key: &[u8]) -> &[u32] {
        self.entries.get(key).map_or(&[], |e| e.ids.as_slice())
    }

    /// Whether block `id` is cached under `key`.
    pub(super) fn contains(&self, key: &[u8], id: u32) -> bool {
        self.ids(key).contains(&id)
    }

    /// Caches block `id` under `key_obj`'s bytes, after the blocks already
    /// there.
    pub(super) fn insert(&mut self, key_obj: &Bound<'_, PyBytes>, id: u32) {
        let key = key_obj.as_bytes();
        match self.entries.get_mut(key) {
            Some(entry) => entry.ids.push(id),
            None => {
                let entry = Entry {
                    key: key_obj.clone().unbind(),
                    ids: vec![id],
                };
                self.entries.insert(key.into(), entry);
            }
        }
    }

    /// Removes `id` from the blocks cached under `key`; whether it was there.
    pub(super) fn remove(&mut self, key: &[u8], id: u32) -> bool {
        let Some(entry) = self.entries.get_mut(key) else {
            return false;
        };
        let Some(at) = entry.ids.iter().position(|&i| i == id) else {
            return false;
        };
        entry.ids.remove(at);
        if entry.ids.is_empty() {
            self.entries.remove(key);
        }
        true
    }

    /// Every key, as Python holds it.
    pub(super) fn keys(&self) -> impl Iterator<Item = &Py<PyBytes>> {
        self.entries.values().map(|e| &e.key)
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }
}
