//! Where a data server's chunk store keeps a chunk's file, for tests that reach into the
//! disk (damage a copy, take one away, count what is left). The layout is the store's
//! (`data-server/src/store/mod.rs`): chunk 0 of an inode in its bucket, the others in the
//! inode's directory.

use std::path::{Path, PathBuf};

/// The file of chunk `index` of inode `ino` under the data directory `data_dir`.
pub fn chunk_file(data_dir: &Path, ino: u64, index: u64) -> PathBuf {
    let bucket = data_dir.join("chunks").join(format!("{:02x}", ino % 256));
    if index == 0 {
        bucket.join(format!("{ino:016x}.chunk"))
    } else {
        bucket
            .join(format!("{ino:016x}"))
            .join(format!("{index:016x}.chunk"))
    }
}

/// The inode and chunk index a chunk file's path names, or `None` for another file.
pub fn chunk_of(path: &Path) -> Option<(u64, u64)> {
    let hex = |s: &str| {
        (s.len() == 16)
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    let stem = path.file_name()?.to_str()?.strip_suffix(".chunk")?;
    let parent = path.parent()?.file_name()?.to_str()?;
    if parent.len() == 2 {
        Some((hex(stem)?, 0))
    } else {
        Some((hex(parent)?, hex(stem)?))
    }
}

/// Every chunk file under `dir` (a data directory, or a directory holding several), with
/// the inode and index it holds.
pub fn chunk_files_under(dir: &Path) -> Vec<(PathBuf, (u64, u64))> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(c) = chunk_of(&p) {
                out.push((p, c));
            }
        }
    }
    out
}

/// Every chunk file of inode `ino` on the data servers of the cluster in `cluster_dir`
/// (its `data-*` directories); all inodes' with `None`.
pub fn cluster_chunk_files(cluster_dir: &Path, ino: Option<u64>) -> Vec<(PathBuf, (u64, u64))> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(cluster_dir)
        .expect("cluster dir")
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with("data-") && e.path().is_dir() {
            let files = chunk_files_under(&e.path());
            out.extend(
                files
                    .into_iter()
                    .filter(|(_, c)| ino.is_none_or(|i| c.0 == i)),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_chunk() {
        let d = Path::new("/d");
        assert_eq!(
            chunk_file(d, 0x1234, 0),
            Path::new("/d/chunks/34/0000000000001234.chunk")
        );
        assert_eq!(
            chunk_file(d, 0x1234, 2),
            Path::new("/d/chunks/34/0000000000001234/0000000000000002.chunk")
        );
        for index in [0, 2] {
            assert_eq!(
                chunk_of(&chunk_file(d, 0x1234, index)),
                Some((0x1234, index))
            );
        }
        assert_eq!(chunk_of(Path::new("/d/chunks/34/node_id")), None);
    }
}
