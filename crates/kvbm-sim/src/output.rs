//! [`write_files`]: a mode's output files (`--out DIR`), written with
//! errors that name the path; [`FigureFiles`]: a sweep's table and plot.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::SimError;

/// The files a sweep wrote: `STEM.csv`, `STEM.md` and `STEM.svg`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FigureFiles {
    /// Every run, one row each.
    pub csv: PathBuf,
    /// The table the sweep prints.
    pub markdown: PathBuf,
    /// The plot.
    pub svg: PathBuf,
}

impl FigureFiles {
    /// Writes `STEM.csv`, `STEM.md` and `STEM.svg` into `dir`, creating it
    /// if needed.
    pub(crate) fn write(
        dir: &Path,
        stem: &str,
        csv: &str,
        markdown: &str,
        svg: &str,
    ) -> Result<Self, SimError> {
        let files = Self {
            csv: dir.join(format!("{stem}.csv")),
            markdown: dir.join(format!("{stem}.md")),
            svg: dir.join(format!("{stem}.svg")),
        };
        write_files(
            dir,
            &[
                (&files.csv, csv),
                (&files.markdown, markdown),
                (&files.svg, svg),
            ],
        )?;
        Ok(files)
    }

    /// The three paths, as a JSON array (the `files` field).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!([self.csv, self.markdown, self.svg])
    }
}

/// `A, B and C`.
impl fmt::Display for FigureFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {} and {}",
            self.csv.display(),
            self.markdown.display(),
            self.svg.display()
        )
    }
}

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
