//! Namespace paths as the library API takes them: pure functions, no I/O.

use crate::error::{ClientError, Result};
use proto::{ErrorCode, WireError};

/// The longest path the API takes, as Linux's `PATH_MAX`.
pub const MAX_PATH_BYTES: usize = 4096;

/// The names of `path` from the namespace root: "/a/b" and "a/b" both name `b` in `a`
/// in the root (a library has no working directory), "." is dropped and ".." takes the
/// name before it off (lexically; at the root it stays there, as "/.." does).
pub fn components(path: &str) -> Result<Vec<&str>> {
    if path.len() > MAX_PATH_BYTES {
        let msg = format!(
            "a path of {} bytes is longer than {MAX_PATH_BYTES}",
            path.len()
        );
        return Err(refused(ErrorCode::NameTooLong, msg));
    }
    if path.contains('\0') {
        return Err(ClientError::Invalid(format!("{path:?} holds a NUL byte")));
    }
    let mut names = Vec::new();
    for name in path.split('/') {
        match name {
            "" | "." => {}
            ".." => {
                names.pop();
            }
            // As a path walk: a name longer than a directory entry holds is
            // ENAMETOOLONG wherever it stands, not a name that is missing.
            n if n.len() > proto::MAX_NAME_BYTES => {
                let msg = format!(
                    "a name of {} bytes is longer than {}",
                    n.len(),
                    proto::MAX_NAME_BYTES
                );
                return Err(refused(ErrorCode::NameTooLong, msg));
            }
            n => names.push(n),
        }
    }
    Ok(names)
}

/// `path` split into its parent's names and its last name; `None` for the root, which
/// has no last name (each call fails on it with the errno Linux gives).
pub fn split_last(path: &str) -> Result<Option<(Vec<&str>, &str)>> {
    let mut names = components(path)?;
    Ok(names.pop().map(|last| (names, last)))
}

/// Whether the last name of `path` is "." or ".." (`rename(2)` refuses such a path,
/// once the walk reached it, with `EBUSY`).
pub fn ends_in_dot(path: &str) -> bool {
    matches!(
        path.trim_end_matches('/').rsplit('/').next(),
        Some("." | "..")
    )
}

/// Whether `path` can only name a directory: it ends in "/", "/." or "/.." (so
/// `remove_file("f/")` fails with `ENOTDIR`, as `unlink(2)` does).
pub fn wants_dir(path: &str) -> bool {
    let last = path.rsplit('/').next().unwrap_or("");
    path.contains('/') && matches!(last, "" | "." | "..") || matches!(path, "." | "..")
}

/// An error with `code`, refused by the client itself.
pub fn refused(code: ErrorCode, msg: String) -> ClientError {
    ClientError::Refused(WireError::new(code, msg))
}

/// `path` in its canonical form ("/a/b"), the key under which a directory's inode is
/// kept.
pub fn canonical(names: &[&str]) -> String {
    let mut s = String::with_capacity(names.iter().map(|n| n.len() + 1).sum());
    for n in names {
        s.push('/');
        s.push_str(n);
    }
    if s.is_empty() {
        s.push('/');
    }
    s
}

/// The names a symlink's `target` leads to when it stood at `parent` (the names of the
/// directory holding the link), followed by `rest`: an absolute target starts again
/// at the namespace root.
pub fn spliced<'a>(parent: &[&'a str], target: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut names: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        parent.to_vec()
    };
    for name in target.split('/') {
        match name {
            "" | "." => {}
            ".." => {
                names.pop();
            }
            n => names.push(n),
        }
    }
    names.extend_from_slice(rest);
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_read_from_the_root_with_dots_resolved_by_name() {
        assert_eq!(components("/a/b").unwrap(), ["a", "b"]);
        assert_eq!(components("a//b/").unwrap(), ["a", "b"]);
        assert_eq!(components("/a/./b/../c").unwrap(), ["a", "c"]);
        assert_eq!(components("/../..").unwrap(), Vec::<&str>::new());
        assert_eq!(components("").unwrap(), Vec::<&str>::new());
        assert!(components("a\0b").is_err());
        let long = components(&"x".repeat(MAX_PATH_BYTES + 1)).unwrap_err();
        assert_eq!(long.errno(), libc::ENAMETOOLONG);
        let name = "n".repeat(proto::MAX_NAME_BYTES);
        assert_eq!(components(&format!("/a/{name}")).unwrap(), ["a", &name]);
        let over = format!("/a/{name}n/..");
        assert_eq!(components(&over).unwrap_err().errno(), libc::ENAMETOOLONG);
    }

    #[test]
    fn the_last_name_is_split_off_and_the_root_has_none() {
        assert_eq!(split_last("/a/b").unwrap(), Some((vec!["a"], "b")));
        assert_eq!(split_last("b").unwrap(), Some((vec![], "b")));
        assert_eq!(split_last("/").unwrap(), None);
        assert_eq!(split_last("/a/..").unwrap(), None);
    }

    #[test]
    fn a_trailing_slash_or_dot_asks_for_a_directory() {
        for p in ["/a/", "a/.", "/a/..", ".", "/"] {
            assert!(wants_dir(p), "{p}");
        }
        for p in ["/a", "a", "/a/.b", ""] {
            assert!(!wants_dir(p), "{p}");
        }
    }

    #[test]
    fn a_last_name_of_dot_or_dot_dot_is_seen_past_slashes() {
        for p in ["a/.", "/a/..", "a/./", ".", "..//"] {
            assert!(ends_in_dot(p), "{p}");
        }
        for p in ["/a", "a/", "/", "", "a/.b", "..a"] {
            assert!(!ends_in_dot(p), "{p}");
        }
    }

    #[test]
    fn canonical_paths_key_directories() {
        assert_eq!(canonical(&[]), "/");
        assert_eq!(canonical(&["a", "b"]), "/a/b");
    }

    #[test]
    fn symlink_targets_splice_relative_to_their_directory_or_the_root() {
        assert_eq!(spliced(&["a", "b"], "../c", &["d"]), ["a", "c", "d"]);
        assert_eq!(spliced(&["a"], "/x/y", &[]), ["x", "y"]);
        assert_eq!(spliced(&["a"], "./z", &["w"]), ["a", "z", "w"]);
    }
}
