//! Reading a config file: a regular file of at most [`MAX_CONFIG_BYTES`],
//! in UTF-8 (and a key file for `plan --keys`, at most [`MAX_KEYS_BYTES`]). A FIFO would block `check` and every reload forever, and
//! `/dev/zero` would be read without end; both are refused by what the open
//! file *is*, checked on the open descriptor (no race with a rename), and the
//! open itself does not wait for a FIFO's writer.

use std::fs::{File, FileType};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest config file magpie reads: far above any real pool (10,000
/// backends take about 600 KB) and far below what would hurt.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// The largest key file `plan --keys` reads: a few million keys.
pub const MAX_KEYS_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read: {0}")]
    Io(#[from] io::Error),
    #[error("is a {kind}, not a regular file: a {what} must be a file")]
    NotRegular {
        kind: &'static str,
        what: &'static str,
    },
    #[error("is larger than {} MiB (the most a {what} may be)", max >> 20)]
    TooLarge { max: u64, what: &'static str },
    #[error("is not UTF-8 text (line {line}, column {column})")]
    NotUtf8 { line: u64, column: u64 },
}

/// Reads `path` as a config file: regular, at most [`MAX_CONFIG_BYTES`], UTF-8.
pub fn read(path: &Path) -> Result<String, FileError> {
    read_bounded(path, MAX_CONFIG_BYTES, "config")
}

/// The largest certificate or key file magpie reads: a chain of a dozen
/// certificates is under 30 KB.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// Reads `path` as a PEM file (a certificate chain or a private key):
/// regular, at most [`MAX_PEM_BYTES`], UTF-8.
pub fn read_pem(path: &Path) -> Result<String, FileError> {
    read_bounded(path, MAX_PEM_BYTES, "certificate or key file")
}

/// Reads `path` as a key file (`plan --keys`): regular, at most
/// [`MAX_KEYS_BYTES`], UTF-8.
pub fn read_keys(path: &Path) -> Result<String, FileError> {
    read_bounded(path, MAX_KEYS_BYTES, "key file")
}

/// Reads `path`, a regular file of at most `max` bytes of UTF-8; `what` it
/// is names it in errors.
fn read_bounded(path: &Path, max: u64, what: &'static str) -> Result<String, FileError> {
    let mut file = File::options()
        .read(true)
        // A FIFO's open would wait for a writer; non-blocking, it returns at
        // once and the type check below refuses it.
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let kind = kind(meta.file_type());
        return Err(FileError::NotRegular { kind, what });
    }
    let too_large = FileError::TooLarge { max, what };
    if meta.len() > max {
        return Err(too_large);
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow between the check and the read.
    (&mut file).take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large);
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
        let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&valid[line_start..])
            .chars()
            .count() as u64
            + 1;
        FileError::NotUtf8 { line, column }
    })
}

fn kind(t: FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_directories_are_refused() {
        assert!(matches!(
            read(Path::new("/dev/zero")),
            Err(FileError::NotRegular {
                kind: "character device",
                what: "config"
            })
        ));
        assert!(matches!(
            read(Path::new("/")),
            Err(FileError::NotRegular {
                kind: "directory",
                what: "config"
            })
        ));
    }

    #[test]
    fn invalid_utf8_is_placed() {
        let dir = std::env::temp_dir().join(format!("magpie-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.yaml");
        std::fs::write(&path, b"listen: x\nab\xffc\n").unwrap();
        let e = read(&path).unwrap_err();
        assert_eq!(e.to_string(), "is not UTF-8 text (line 2, column 3)");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
