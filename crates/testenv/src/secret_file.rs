//! Files holding keys or credentials (kubeconfigs, private keys, tokens): owner-only, mode 0600,
//! whoever writes them (`tensile up`, `tensile sim`, the `TestEnv`).

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `contents` to `path` with mode 0600, replacing what is there.
///
/// The bytes go to a new 0600 file in the same folder, which is then renamed over `path`: an
/// existing 0644 file ends up 0600 too (opening it would keep its mode), and a reader never sees
/// the credentials half-written or under a wider mode.
pub fn write_secret(path: &Path, contents: impl AsRef<[u8]>) -> io::Result<()> {
    let (tmp, mut file) = create_temp(path)?;
    let written = file
        .write_all(contents.as_ref())
        .and_then(|()| file.flush())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether [`write_secret`] could write `path`, found without creating or changing `path`: a
/// failed start must not leave an empty file behind.
pub fn check_secret_writable(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    let (tmp, file) = create_temp(path)?;
    drop(file);
    std::fs::remove_file(&tmp)
}

/// A new, empty, mode-0600 file next to `path`, named after it and unique in this process.
fn create_temp(path: &Path) -> io::Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not the path of a file"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    Ok((tmp, file))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn dir(what: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tensile-secret-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_new_file_and_a_replaced_0644_file_are_0600_and_nothing_else_is_left() {
        let d = dir("write");
        let p = d.join("kubeconfig");
        write_secret(&p, "one").unwrap();
        assert_eq!(mode(&p), 0o600);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_secret(&p, "two").unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["kubeconfig"]);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn the_check_creates_nothing_and_refuses_what_cannot_be_written() {
        let d = dir("check");
        let p = d.join("kubeconfig");
        check_secret_writable(&p).unwrap();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        assert!(check_secret_writable(&d.join("no-such-dir/kubeconfig")).is_err());
        assert!(check_secret_writable(&d).is_err());
        assert!(write_secret(&d, "x").is_err());
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(d);
    }
}
