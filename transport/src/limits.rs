//! The process's descriptor limit, which connections count against.

/// Raises this process's soft limit on open descriptors to its hard limit. A server
/// holds one descriptor per connection (up to `max_connections`, 1024 by default) besides
/// its own files, above the usual soft limit of 1024; the hard limit is what the
/// administrator allows, so taking it needs no privilege. Failure is logged, not fatal:
/// the server still runs, with fewer connections.
pub fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return;
    }
    let was = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit read just above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        tracing::debug!(from = was, to = lim.rlim_cur, "raised the open-file limit");
    } else {
        tracing::warn!(limit = was, error = %std::io::Error::last_os_error(),
            "could not raise the open-file limit");
    }
}
