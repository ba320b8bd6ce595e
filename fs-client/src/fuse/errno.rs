//! The one place where Tessera error codes become errno values.

use fuser::Errno;
use proto::ErrorCode;

/// The errno an application sees for `code`. Exhaustive on purpose: a new code does not
/// compile until someone decides what applications see for it.
pub fn errno(code: ErrorCode) -> Errno {
    match code {
        ErrorCode::NotFound => Errno::ENOENT,
        ErrorCode::AlreadyExists => Errno::EEXIST,
        ErrorCode::NotADirectory => Errno::ENOTDIR,
        ErrorCode::IsADirectory => Errno::EISDIR,
        ErrorCode::NotEmpty => Errno::ENOTEMPTY,
        ErrorCode::InvalidArgument => Errno::EINVAL,
        ErrorCode::NameTooLong => Errno::ENAMETOOLONG,
        ErrorCode::PermissionDenied => Errno::EACCES,
        ErrorCode::NotPermitted => Errno::EPERM,
        ErrorCode::NoSpace => Errno::ENOSPC,
        ErrorCode::Io => Errno::EIO,
        // Never hand out bytes that failed their checksum: the read fails instead.
        ErrorCode::Corrupt => Errno::EIO,
        ErrorCode::Stale => Errno::ESTALE,
        ErrorCode::VersionMismatch => Errno::EPROTO,
        ErrorCode::Malformed => Errno::EPROTO,
        ErrorCode::UnknownMessage => Errno::EPROTO,
        ErrorCode::Unavailable => Errno::EIO,
        ErrorCode::TimedOut => Errno::ETIMEDOUT,
        ErrorCode::TooBig => Errno::EFBIG,
        ErrorCode::NoData => Errno::ENODATA,
        ErrorCode::Range => Errno::ERANGE,
        ErrorCode::NotSupported => Errno::EOPNOTSUPP,
        ErrorCode::TooManyLinks => Errno::EMLINK,
        ErrorCode::Busy => Errno::EBUSY,
        ErrorCode::AccessViolation => Errno::EIO,
        ErrorCode::Overloaded => Errno::EAGAIN,
        ErrorCode::WouldBlock => Errno::EAGAIN,
        ErrorCode::Interrupted => Errno::EINTR,
        ErrorCode::ReadOnly => Errno::EROFS,
        // A data server refused the grant even after the client renewed it: the
        // metadata server no longer lets this client at the file.
        ErrorCode::GrantMissing
        | ErrorCode::GrantForged
        | ErrorCode::GrantExpired
        | ErrorCode::GrantWrongClient
        | ErrorCode::GrantWrongFile
        | ErrorCode::GrantWrongMode => Errno::EACCES,
        ErrorCode::Unknown => Errno::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_codes_map_to_the_errno_applications_expect() {
        assert_eq!(errno(ErrorCode::NotFound), Errno::ENOENT);
        assert_eq!(errno(ErrorCode::NotEmpty), Errno::ENOTEMPTY);
        assert_eq!(errno(ErrorCode::Corrupt), Errno::EIO);
        assert_eq!(errno(ErrorCode::NoData), Errno::ENODATA);
    }

    /// Guards against a local client error changing the errno applications saw when it
    /// was sent as a `Remote` error with the same code.
    #[test]
    fn local_client_errors_keep_their_errno() {
        use crate::error::ClientError as E;
        let cases = [
            (E::NotInMap(String::new()), Errno::EIO),
            (E::MetaAway(String::new()), Errno::EIO),
            (E::NoDataServers(String::new()), Errno::ENOSPC),
            (E::NoSpace(String::new()), Errno::ENOSPC),
            (E::TooLarge(String::new()), Errno::EFBIG),
            (E::NotSupported(String::new()), Errno::EOPNOTSUPP),
            (E::KnownAbsent(String::new()), Errno::ENOENT),
            (E::NoXattr(String::new()), Errno::ENODATA),
            (E::OpenLost(String::new()), Errno::EIO),
            (E::Interrupted(String::new()), Errno::EINTR),
        ];
        for (e, want) in cases {
            assert_eq!(errno(e.code()), want, "{e}");
        }
    }
}
