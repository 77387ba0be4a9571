//! What a store's path may name, checked before any open touches it: a regular file or
//! nothing (a FIFO, a socket, a device, a directory, a link that leads to no file, or a
//! path ending with `/` is refused, each named in words).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Refuses a `path` that exists and is not a regular file (a FIFO, a socket, a device or a
/// directory), before any open touches it: opening a FIFO would block until a writer came;
/// and a symbolic link that leads to no file ([`broken_link`]), which no open would say more
/// of than "no such file"; and a path that names nothing and ends with `/` (a directory's
/// name; [`names_a_directory`] says what was meant, a file of that name included). Any other
/// path that does not exist passes (the open that follows says so, or creates the store).
pub(in crate::store) fn refuse_special_file(path: &Path) -> Result<()> {
    let refuse = |cause: String| {
        Err(Error::Open {
            path: path.to_path_buf(),
            cause: cause.into(),
        })
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(meta) => refuse(format!(
            "it is {}, not a regular file; a store is a regular file",
            file_kind(&meta.file_type())
        )),
        Err(followed) => match std::fs::read_link(path) {
            Ok(target) => refuse(broken_link(path, &target, &followed)),
            Err(_) if path.as_os_str().as_encoded_bytes().ends_with(b"/") => {
                refuse(names_a_directory(path))
            }
            Err(_) => Ok(()),
        },
    }
}

/// Why the symbolic link at `path`, to `target`, leads to no file (`followed`: the error of
/// following it): its target does not exist; or it does, and is a link in a chain that ends
/// at nothing; or the links cannot be followed (a loop of links, a directory not searchable),
/// said in the system's words. A store is not created through a link.
fn broken_link(path: &Path, target: &Path, followed: &std::io::Error) -> String {
    let target_text = target.display();
    if followed.kind() != std::io::ErrorKind::NotFound {
        return format!(
            "it is a symbolic link to {target_text}, which cannot be followed ({followed})"
        );
    }
    let resolved = path.parent().unwrap_or(Path::new("")).join(target);
    if std::fs::symlink_metadata(&resolved).is_ok() {
        format!(
            "it is a symbolic link to {target_text}, a link in a chain that ends at nothing; a \
             store is not created through a link"
        )
    } else {
        format!(
            "it is a symbolic link to {target_text}, which does not exist; a store is not \
             created through a link"
        )
    }
}

/// Why `path`, which ends with `/` and names nothing, is no store's path: it names a
/// directory. If a file is there under the name without the `/` (`FILE/` for an existing
/// `FILE`: the path cannot be looked up, since `FILE` is no directory), the store was meant:
/// name it without the `/`; else a store is to be named in that directory.
fn names_a_directory(path: &Path) -> String {
    // Components leave the trailing `/` out.
    let without: PathBuf = path.components().collect();
    if without.is_file() {
        format!(
            "the path ends with `/`, which names a directory, and {} is a file: name the store \
             without the `/`",
            without.display()
        )
    } else {
        "the path ends with `/`, which names a directory; a store is a regular file: name one \
         in that directory (DIR/agent.redb)"
            .to_owned()
    }
}

/// The first of `dir` and its ancestors that is a symbolic link to nothing, with its target.
pub(super) fn dangling_link_in(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    dir.ancestors().find_map(|at| {
        let link = std::fs::symlink_metadata(at).ok()?.file_type().is_symlink();
        if !link || at.exists() {
            return None;
        }
        Some((at.to_path_buf(), std::fs::read_link(at).ok()?))
    })
}

/// What a file of `file_type` is, in words ("a regular file", "a directory", "a symbolic
/// link", "a FIFO (named pipe)", "a socket", ...), for refusals that name what they found.
pub(crate) fn file_kind(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else {
        special_file_kind(file_type)
    }
}

#[cfg(unix)]
fn special_file_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "a FIFO (named pipe)"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_char_device() {
        "a character device"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_file_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}
