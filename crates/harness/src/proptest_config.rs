//! The harness's property-test settings: the core's cases and seed
//! ([`bisect_core::proptest_config`]), and where properties that touch files keep them.

pub(crate) use bisect_core::proptest_config::config;

/// A scratch directory in memory where the system has one (`/dev/shm`), else the usual
/// temporary directory. On a disk, rewriting a file flushes it (and the journal
/// fsyncs), which turns 10,000 cases into minutes; in memory they take seconds.
pub(crate) fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("a temporary directory")
}
