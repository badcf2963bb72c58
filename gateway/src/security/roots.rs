//! The local files `/api/pull` may serve: regular files under the model
//! roots (`[server] model_roots`; by default the models directory and the
//! paths given at start), checked after every `..` and symlink is resolved, opened without blocking (a FIFO or device never holds a
//! thread). Whatever is wrong, the caller learns only "not found or not
//! allowed": a pull must not tell whether `/etc/shadow` exists.
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Canonical roots: directories (everything below them) and single files.
#[derive(Debug, Clone)]
pub struct ModelRoots {
    roots: Vec<PathBuf>,
}

/// A local path refused: it does not exist, or is not allowed. Deliberately
/// says nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAllowed;

impl ModelRoots {
    /// Roots that do not exist (yet) are kept as given, made absolute.
    pub fn new(roots: &[PathBuf]) -> ModelRoots {
        let roots = roots
            .iter()
            .filter_map(|root| {
                std::fs::canonicalize(root)
                    .ok()
                    .or_else(|| std::path::absolute(root).ok())
            })
            .collect();
        ModelRoots { roots }
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// Resolves a client's path to a regular file under a root; its
    /// canonical path and its first `header.len()` bytes (fewer if the file is shorter).
    pub fn open(&self, raw: &str, header: &mut [u8]) -> Result<(PathBuf, usize), NotAllowed> {
        // `..` and symlinks resolved first: only where the path really leads counts.
        let canonical = std::fs::canonicalize(raw).map_err(|_| NotAllowed)?;
        if !self.contains(&canonical) {
            return Err(NotAllowed);
        }
        // Canonical: no symlink left to follow; a FIFO, socket or device stops here.
        let meta = std::fs::symlink_metadata(&canonical).map_err(|_| NotAllowed)?;
        if !meta.file_type().is_file() {
            return Err(NotAllowed);
        }
        // Swapped for a FIFO since? O_NONBLOCK opens it without waiting for
        // a writer, and the open file is checked again.
        let mut file = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(&canonical)
            .map_err(|_| NotAllowed)?;
        let meta = file.metadata().map_err(|_| NotAllowed)?;
        if !meta.file_type().is_file() {
            return Err(NotAllowed);
        }
        let mut filled = 0;
        while filled < header.len() {
            match file.read(&mut header[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(_) => return Err(NotAllowed),
            }
        }
        Ok((canonical, filled))
    }

    fn contains(&self, canonical: &Path) -> bool {
        self.roots
            .iter()
            .any(|root| canonical == root || (canonical.starts_with(root) && root.is_dir()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_under_the_roots() {
        let dir = std::env::temp_dir().join(format!("hypura-roots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let inside = dir.join("models");
        std::fs::create_dir_all(inside.join("sub")).unwrap();
        std::fs::write(inside.join("sub/a.gguf"), b"GGUF\x03\0\0\0").unwrap();
        std::fs::write(dir.join("outside.gguf"), b"GGUF").unwrap();
        std::os::unix::fs::symlink(dir.join("outside.gguf"), inside.join("link.gguf")).unwrap();
        let fifo = inside.join("fifo.gguf");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());

        let roots = ModelRoots::new(std::slice::from_ref(&inside));
        let mut header = [0u8; 4];
        let (path, n) = roots
            .open(inside.join("sub/a.gguf").to_str().unwrap(), &mut header)
            .unwrap();
        assert_eq!((n, &header), (4, b"GGUF"));
        assert!(path.ends_with("models/sub/a.gguf"));
        let refused = |p: &Path| roots.open(p.to_str().unwrap(), &mut [0u8; 4]);
        assert_eq!(refused(&dir.join("outside.gguf")), Err(NotAllowed));
        assert_eq!(refused(&inside.join("link.gguf")), Err(NotAllowed));
        assert_eq!(refused(&inside.join("../outside.gguf")), Err(NotAllowed));
        assert_eq!(
            refused(&inside.join("sub/../../outside.gguf")),
            Err(NotAllowed)
        );
        assert!(roots
            .open(
                inside.join("sub/../sub/a.gguf").to_str().unwrap(),
                &mut [0u8; 4]
            )
            .is_ok());
        assert_eq!(refused(&fifo), Err(NotAllowed));
        assert_eq!(refused(&inside), Err(NotAllowed));
        assert_eq!(refused(Path::new("/etc/shadow")), Err(NotAllowed));
        assert_eq!(refused(&inside.join("missing.gguf")), Err(NotAllowed));
        // A single file as a root.
        let one = ModelRoots::new(&[dir.join("outside.gguf")]);
        assert!(one
            .open(dir.join("outside.gguf").to_str().unwrap(), &mut [0u8; 4])
            .is_ok());
        assert_eq!(
            one.open(inside.join("sub/a.gguf").to_str().unwrap(), &mut [0u8; 4]),
            Err(NotAllowed)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
