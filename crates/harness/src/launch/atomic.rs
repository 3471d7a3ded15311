//! Atomic file replacement for the files bisect owns or edits (launch configs, the
//! journal, the state directory's records): the temporary file's place, the write, the
//! rename and the directory sync. Below both the journal and the state module, which
//! each write through it.

use std::fs::{self, File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where a file's in-progress atomic write goes: beside it, so the rename stays on one
/// filesystem, under a fixed name so recovery can clean it up.
pub(in crate::launch) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.bisect-tmp"))
}

/// fsync of a directory makes a rename in it durable; some filesystems refuse it, and
/// the data itself is already synced, so that failure is only logged.
pub(in crate::launch) fn sync_dir(dir: &Path) {
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::debug!("fsync of directory {} failed: {e}", dir.display());
    }
}

/// Replace `path` with `bytes` (permissions `mode`) so that a crash leaves the old file
/// or the new one, never a part: written beside it, synced, renamed over it.
pub(in crate::launch) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(Permissions::from_mode(mode & 0o7777))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    if let Some(dir) = path.parent() {
        sync_dir(dir);
    }
    Ok(())
}
