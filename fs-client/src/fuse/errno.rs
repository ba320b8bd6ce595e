//! Tessera error codes as the kernel's errno values, for FUSE replies.

use fuser::Errno;
use proto::ErrorCode;

/// The errno an application sees for `code` (mapped in `crate::error::errno`).
pub fn errno(code: ErrorCode) -> Errno {
    Errno::from_i32(crate::error::errno(code))
}

/// The errno a failed call answers with: its code's, or the one of a client error no
/// wire code names (`ClientError::errno`).
pub fn errno_of(e: &crate::error::ClientError) -> Errno {
    Errno::from_i32(e.errno())
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
            assert_eq!(errno_of(&e), want, "{e}");
        }
        // Errors no wire code names keep their own errno.
        assert_eq!(E::PastEnd(String::new()).errno(), libc::ENXIO);
        assert_eq!(E::BadHandle(String::new()).errno(), libc::EBADF);
    }
}
