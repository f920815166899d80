//! Opening a store's directory: checking that it is a store's (or empty)
//! and writable, locking it, and reading or writing its metadata.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use tracing::warn;

use super::DiskConfig;
use super::layout::{Geometry, LOCK, META, META_LEN, META_TMP, Meta, PROBE};
use crate::StoreError;

/// A directory ready for its slot files.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) geometry: Geometry,
    /// Held (and locked) while the store is open.
    pub(crate) lock: File,
    /// The store was made now, not found.
    pub(crate) created: bool,
}

/// Opens (or creates) the store's directory as `config` says.
pub(crate) fn open(config: &DiskConfig) -> Result<Opened, StoreError> {
    let asked = Geometry::new(
        config.block_bytes,
        config.capacity_blocks,
        config.slots_per_file,
    )
    .map_err(StoreError::Config)?;
    let dir = config.dir.as_path();
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(refused(dir, "is not a directory".into())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            if !config.create {
                return Err(refused(dir, "does not exist".into()));
            }
            fs::create_dir_all(dir).map_err(|err| refused(dir, unwritable("be created", &err)))?;
        }
        Err(err) => return Err(refused(dir, format!("cannot be read: {err}"))),
    }
    let lock = lock(dir)?;
    probe(dir)?;
    let (geometry, created) = match read_meta(dir)? {
        Some(bytes) => (reopen(config, dir, &bytes)?, false),
        None => {
            refuse_foreign(dir)?;
            if !config.create {
                return Err(refused(dir, "holds no disk store".into()));
            }
            write_meta(dir, &asked)?;
            (asked, true)
        }
    };
    Ok(Opened {
        geometry,
        lock,
        created,
    })
}

/// The geometry of the store found in `dir`, checked against `config`.
fn reopen(config: &DiskConfig, dir: &Path, bytes: &[u8]) -> Result<Geometry, StoreError> {
    let meta = Meta::decode(bytes).map_err(|reason| refused(dir, format!("{META}: {reason}")))?;
    if meta.block_bytes != config.block_bytes as u64 {
        return Err(StoreError::WrongSize {
            expected: usize::try_from(meta.block_bytes).unwrap_or(usize::MAX),
            got: config.block_bytes,
        });
    }
    let stored = meta
        .geometry(config.block_bytes)
        .map_err(|reason| refused(dir, format!("{META} declares {reason}")))?;
    let stored_capacity = stored.capacity() as usize;
    if config.capacity_blocks < stored_capacity {
        return Err(StoreError::Config(format!(
            "the store in {} holds up to {stored_capacity} blocks; opening it with a capacity \
             of {} could drop stored blocks",
            dir.display(),
            config.capacity_blocks
        )));
    }
    if config.capacity_blocks == stored_capacity {
        return Ok(stored);
    }
    let grown = stored
        .with_capacity(config.capacity_blocks)
        .map_err(StoreError::Config)?;
    write_meta(dir, &grown)?;
    Ok(grown)
}

/// Takes the directory's lock file, so two stores never share it.
fn lock(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|err| refused(dir, unwritable(&format!("lock {LOCK}"), &err)))?;
    match try_lock_briefly(&file) {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => {
            Err(refused(dir, "is in use by another open disk store".into()))
        }
        Err(TryLockError::Error(err)) if err.kind() == io::ErrorKind::Unsupported => {
            warn!(dir = %dir.display(), "file locks are unsupported here: nothing stops a second store opening this directory");
            Ok(file)
        }
        Err(TryLockError::Error(err)) => Err(refused(dir, format!("cannot lock {LOCK}: {err}"))),
    }
}

/// How long a busy lock is retried before the directory counts as in use.
const LOCK_PATIENCE: Duration = Duration::from_millis(200);

/// Takes the lock, retrying for [`LOCK_PATIENCE`] while it is busy: a store
/// just closed in this process can still hold it for an instant, because
/// a child being spawned by another thread keeps a copy of every open file
/// until it execs (the lock lives as long as any copy does).
fn try_lock_briefly(file: &File) -> Result<(), TryLockError> {
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Err(TryLockError::WouldBlock) if started.elapsed() < LOCK_PATIENCE => {
                thread::sleep(Duration::from_millis(2));
            }
            other => return other,
        }
    }
}

/// Creates and removes a file, so a read-only directory is refused now
/// rather than at the first put.
fn probe(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(PROBE);
    File::create(&path).map_err(|err| refused(dir, unwritable("create files", &err)))?;
    fs::remove_file(&path).map_err(|err| refused(dir, unwritable("remove files", &err)))
}

/// The metadata file's bytes (at most one more than a store writes), or
/// `None` if there is none.
fn read_meta(dir: &Path) -> Result<Option<Vec<u8>>, StoreError> {
    let mut file = match File::open(dir.join(META)) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(refused(dir, format!("cannot open {META}: {err}"))),
    };
    let mut bytes = Vec::with_capacity(META_LEN + 1);
    Read::by_ref(&mut file)
        .take(META_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| refused(dir, format!("cannot read {META}: {err}")))?;
    Ok(Some(bytes))
}

/// Refuses a directory without metadata that holds anything but the files
/// an interrupted creation leaves: its files are someone else's.
fn refuse_foreign(dir: &Path) -> Result<(), StoreError> {
    let entries =
        fs::read_dir(dir).map_err(|err| refused(dir, format!("cannot be listed: {err}")))?;
    for entry in entries {
        let entry = entry.map_err(|err| refused(dir, format!("cannot be listed: {err}")))?;
        let name = entry.file_name();
        if [LOCK, META_TMP, PROBE].iter().any(|ours| name == *ours) {
            continue;
        }
        return Err(refused(
            dir,
            format!(
                "holds {} but no {META}: not a disk store's directory, refusing to use it",
                name.to_string_lossy()
            ),
        ));
    }
    Ok(())
}

/// Writes the metadata atomically: a temporary file, synced, renamed over
/// the old one, and the directory synced.
fn write_meta(dir: &Path, geometry: &Geometry) -> Result<(), StoreError> {
    let write = || -> io::Result<()> {
        let tmp = dir.join(META_TMP);
        let mut file = File::create(&tmp)?;
        file.write_all(&geometry.encode_meta())?;
        file.sync_all()?;
        fs::rename(&tmp, dir.join(META))?;
        File::open(dir)?.sync_all()
    };
    write().map_err(|err| refused(dir, unwritable(&format!("write {META}"), &err)))
}

fn refused(dir: &Path, reason: String) -> StoreError {
    StoreError::Directory {
        path: dir.to_path_buf(),
        reason,
    }
}

/// Why `what` failed, naming a read-only directory as one.
fn unwritable(what: &str, err: &io::Error) -> String {
    match err.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            format!("is read-only: cannot {what}: {err}")
        }
        _ => format!("cannot {what}: {err}"),
    }
}
