//! The journal's file operations: the writability probe, atomic writes (temp file, fsync,
//! rename, permissions kept), the originals kept aside durably, and the journal file
//! itself written and cleared.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{Journal, COPY_PREFIX, JOURNAL_FILE};
pub(super) use crate::launch::atomic::{sync_dir, temp_path, write_atomic};
use crate::launch::LaunchError;

/// Refuses, before any edit, a launch config bisect could not write or restore: a
/// read-only file (it would otherwise be silently replaced by the rename), a file this
/// user cannot open for writing, or a folder where the atomic write's temp file cannot
/// be created.
pub(super) fn check_writable(path: &Path, mode: u32) -> Result<(), LaunchError> {
    let refuse = |reason: String, fix: String| LaunchError::NotWritable {
        path: path.to_path_buf(),
        reason,
        fix,
    };
    if mode & 0o222 == 0 {
        return Err(refuse(
            format!("is read-only (mode {:04o})", mode & 0o7777),
            format!("make it writable (chmod u+w {}) if bisect may edit it, or leave its flags out of the run", path.display()),
        ));
    }
    if let Err(e) = fs::OpenOptions::new().write(true).open(path) {
        return Err(refuse(
            format!("cannot be opened for writing: {e}"),
            "run bisect as a user who may write the launch configs".into(),
        ));
    }
    let probe = temp_path(path);
    let folder = path.parent().unwrap_or(Path::new("/"));
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(refuse(
            format!(
                "sits in {} where bisect cannot create {} for its atomic writes: {e}",
                folder.display(),
                probe.display()
            ),
            format!("make {} writable for this user", folder.display()),
        )),
    }
}

/// Saves someone else's version of the launch config `path` beside it, under a new name
/// (`<name>.changed-during-bisect-<UTC time>[-N]`, never overwriting a file) that no
/// `*.sh`-style glob picks up, without execute permission. Returns the copy's path.
pub(super) fn keep_aside(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<PathBuf> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    for n in 1u32.. {
        let suffix = if n == 1 {
            String::new()
        } else {
            format!("-{n}")
        };
        let copy = path.with_file_name(format!("{name}.changed-during-bisect-{stamp}{suffix}"));
        let mut file = match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode & 0o666)
            .open(&copy)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "keeping the changed version of {} in {}",
                        path.display(),
                        copy.display()
                    )
                })
            }
        };
        if let Err(e) = file.write_all(bytes).and_then(|()| file.sync_all()) {
            let _ = fs::remove_file(&copy);
            return Err(e).with_context(|| {
                format!(
                    "keeping the changed version of {} in {}",
                    path.display(),
                    copy.display()
                )
            });
        }
        if let Some(dir) = copy.parent() {
            sync_dir(dir);
        }
        return Ok(copy);
    }
    unreachable!("a free name is found before the counter runs out")
}

pub(super) fn remove_copies(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(COPY_PREFIX) {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

pub(super) fn write_journal(dir: &Path, journal: &Journal) -> anyhow::Result<()> {
    let path = dir.join(JOURNAL_FILE);
    let json = serde_json::to_vec_pretty(journal).context("encoding the journal")?;
    write_atomic(&path, &json, 0o600).with_context(|| format!("writing {}", path.display()))
}

/// Removes the journal in `dir` and its saved originals: the originals are back.
pub(super) fn clear_journal(dir: &Path) -> anyhow::Result<()> {
    let journal_path = dir.join(JOURNAL_FILE);
    match fs::remove_file(&journal_path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", journal_path.display())),
    }
    remove_copies(dir).with_context(|| format!("removing saved originals in {}", dir.display()))?;
    sync_dir(dir);
    Ok(())
}
