//! The one way a record becomes text (docs/architecture.md): every record kind (run,
//! matrix, culprit, diff, check) has one [`Exporter`] per format, one file per format,
//! and every file in a results directory has exactly one producer. A whole-file format
//! names the file it is written to; a printed one (a terminal table) names itself.

use std::path::Path;

/// One rendering of a record of type `R`.
pub trait Exporter<R: ?Sized> {
    /// The file inside the results directory (`summary.md`), or for a format only
    /// printed, its name (`table`).
    fn file_name(&self) -> &'static str;
    fn render(&self, record: &R) -> anyhow::Result<String>;
    /// Render with the results directory at hand (sessions.jsonl, metrics.csv), for
    /// formats that show more than the record.
    fn render_in(&self, record: &R, _dir: &Path) -> anyhow::Result<String> {
        self.render(record)
    }
}

/// Rewrites `record`'s whole-file formats in `dir`, each atomically.
pub fn write_all<R: ?Sized>(
    dir: &Path,
    record: &R,
    exporters: &[&dyn Exporter<R>],
) -> anyhow::Result<()> {
    for exporter in exporters {
        let text = exporter.render_in(record, dir)?;
        super::write_atomic(&dir.join(exporter.file_name()), text.as_bytes())?;
    }
    Ok(())
}
