//! Facts of the host a server runs on, shared by both servers: the process's descriptor
//! limit, which connections count against, and the free space of a disk.

/// Raises this process's soft limit on open descriptors to its hard limit, and returns
/// the limit in effect afterwards (`None` if it cannot be read). A server holds one
/// descriptor per connection (up to `max_connections`, 1024 by default) besides its own
/// files, above the usual soft limit of 1024; the hard limit is what the administrator
/// allows, so taking it needs no privilege. Failure is logged, not fatal: the server
/// still runs, with fewer connections.
pub fn raise_open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur >= lim.rlim_max {
        return Some(lim.rlim_cur);
    }
    let was = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit read just above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        tracing::debug!(from = was, to = lim.rlim_cur, "raised the open-file limit");
        Some(lim.rlim_cur)
    } else {
        tracing::warn!(limit = was, error = %std::io::Error::last_os_error(),
            "could not raise the open-file limit");
        Some(was)
    }
}

/// Total and available (to unprivileged users) bytes of the file system holding `dir`.
pub fn disk_space(dir: &std::path::Path) -> std::io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: statvfs is plain old data; all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

#[cfg(test)]
mod tests {
    #[test]
    fn disk_space_of_a_directory_and_of_no_directory() {
        let dir = std::env::temp_dir();
        let (total, avail) = super::disk_space(&dir).unwrap();
        assert!(total > 0 && avail <= total, "{total} {avail}");
        assert!(super::disk_space(&dir.join("no-such-dir-for-tessera")).is_err());
    }
}
