//! Client errors as the `OSError` Python's `os` module would raise.
//!
//! `OSError(errno, strerror, filename)` picks its subclass from the errno
//! (`FileNotFoundError` for ENOENT, `FileExistsError` for EEXIST, ...), so the errno from
//! `ClientError::errno` is all the mapping there is: no table of our own to drift from it.

use fs_client::ClientError;
use pyo3::exceptions::PyOSError;
use pyo3::PyErr;

/// `e` as an `OSError` naming `path` (and `path2`, for a rename).
pub fn os_error(e: &ClientError, path: &str, path2: Option<&str>) -> PyErr {
    let errno = e.errno();
    // strerror as `os` gives it, then what the cluster said.
    let os_text = std::io::Error::from_raw_os_error(errno).to_string();
    let strerror = os_text
        .split(" (os error")
        .next()
        .unwrap_or(os_text.as_str());
    let msg = format!("{strerror} ({e})");
    match path2 {
        // OSError(errno, strerror, filename, winerror, filename2).
        Some(p2) => PyOSError::new_err((errno, msg, path.to_string(), None::<i32>, p2.to_string())),
        None => PyOSError::new_err((errno, msg, path.to_string())),
    }
}

/// A closure mapping an error about `path` (for `map_err`).
pub fn at(path: &str) -> impl Fn(ClientError) -> PyErr + '_ {
    move |e| os_error(&e, path, None)
}
