//! [`write_files`]: a mode's output files (`--out DIR`), written with
//! errors that name the path.

use std::path::Path;

use crate::SimError;

/// Creates `dir` if missing and writes each `(path, contents)` pair.
///
/// # Errors
///
/// [`SimError::WriteOutput`] naming the directory or file that failed.
pub(crate) fn write_files(dir: &Path, files: &[(&Path, &str)]) -> Result<(), SimError> {
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SimError::WriteOutput { path, source }
    };
    std::fs::create_dir_all(dir).map_err(failed(dir))?;
    for (path, contents) in files {
        std::fs::write(path, contents).map_err(failed(path))?;
    }
    Ok(())
}
