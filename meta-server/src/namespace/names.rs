//! Validation of what a request names: entry names, symlink targets, xattr names.

use crate::error::{show, MetaError};
use proto::{MAX_NAME_BYTES, MAX_SYMLINK_BYTES, MAX_XATTR_VALUE_BYTES};

/// Checks a directory entry name: not empty, not `.` or `..`, no `/` or NUL, at most
/// `MAX_NAME_BYTES` bytes.
pub(crate) fn check_name(name: &[u8]) -> Result<(), MetaError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(MetaError::NameTooLong(format!(
            "name of {} bytes, the limit is {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    if name.is_empty() || name == b"." || name == b".." {
        return Err(MetaError::InvalidArgument(format!(
            "reserved name {}",
            show(name)
        )));
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(MetaError::InvalidArgument(format!(
            "name {} contains '/' or NUL",
            show(name)
        )));
    }
    Ok(())
}

/// Checks a symlink target: not empty, no NUL (targets are C strings), at most
/// `MAX_SYMLINK_BYTES` bytes.
pub(crate) fn check_target(target: &[u8]) -> Result<(), MetaError> {
    if target.len() > MAX_SYMLINK_BYTES {
        return Err(MetaError::NameTooLong(format!(
            "symlink target of {} bytes, the limit is {MAX_SYMLINK_BYTES}",
            target.len()
        )));
    }
    if target.is_empty() || target.contains(&0) {
        return Err(MetaError::InvalidArgument(
            "empty symlink target or NUL in it".into(),
        ));
    }
    Ok(())
}

/// Checks an extended attribute name ([`proto::xattr_name_fault`]'s rule).
pub(crate) fn check_xattr_name(name: &[u8]) -> Result<(), MetaError> {
    use proto::XattrNameFault as F;
    match proto::xattr_name_fault(name) {
        None => Ok(()),
        Some(F::TooLong) => Err(MetaError::NameTooLong(format!(
            "xattr name of {} bytes, the limit is {MAX_NAME_BYTES}",
            name.len()
        ))),
        Some(F::Malformed) => Err(MetaError::InvalidArgument(
            "empty xattr name or NUL in it".into(),
        )),
        Some(F::Namespace) => Err(MetaError::NotSupported(format!(
            "xattr {}: only user., trusted. and security. names",
            show(name)
        ))),
        Some(F::NoName) => Err(MetaError::InvalidArgument(format!(
            "xattr name {}",
            show(name)
        ))),
    }
}

/// Checks an extended attribute value's size.
pub(crate) fn check_xattr_value(value: &[u8]) -> Result<(), MetaError> {
    if value.len() > MAX_XATTR_VALUE_BYTES {
        return Err(MetaError::TooBig(format!(
            "xattr value of {} bytes, the limit is {MAX_XATTR_VALUE_BYTES}",
            value.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::ErrorCode;

    fn code(r: Result<(), MetaError>) -> Option<ErrorCode> {
        r.err().map(|e| e.code())
    }

    #[test]
    fn names_follow_linux_rules() {
        assert_eq!(code(check_name(b"ok name")), None);
        assert_eq!(code(check_name(&[b'x'; 255])), None);
        assert_eq!(code(check_name(&[0xff, 0xfe])), None, "non-UTF-8 is fine");
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
            assert_eq!(
                code(check_name(bad)),
                Some(ErrorCode::InvalidArgument),
                "{bad:?}"
            );
        }
        assert_eq!(code(check_name(&[b'x'; 256])), Some(ErrorCode::NameTooLong));
        assert_eq!(
            code(check_name(&[b'/'; 10_000])),
            Some(ErrorCode::NameTooLong)
        );
    }

    #[test]
    fn targets_and_xattrs_have_their_limits() {
        assert_eq!(code(check_target(&[b'a'; 4096])), None);
        assert_eq!(
            code(check_target(&[b'a'; 4097])),
            Some(ErrorCode::NameTooLong)
        );
        assert_eq!(code(check_target(b"")), Some(ErrorCode::InvalidArgument));
        assert_eq!(code(check_xattr_name(b"user.x")), None);
        assert_eq!(code(check_xattr_name(b"security.selinux")), None);
        assert_eq!(
            code(check_xattr_name(b"foo.x")),
            Some(ErrorCode::NotSupported)
        );
        assert_eq!(
            code(check_xattr_name(b"user.")),
            Some(ErrorCode::InvalidArgument)
        );
        assert_eq!(
            code(check_xattr_name(b"")),
            Some(ErrorCode::InvalidArgument)
        );
        let long = [b"user.".to_vec(), vec![b'x'; 251]].concat();
        assert_eq!(code(check_xattr_name(&long)), Some(ErrorCode::NameTooLong));
        assert_eq!(code(check_xattr_value(&[0; 65536])), None);
        assert_eq!(
            code(check_xattr_value(&[0; 65537])),
            Some(ErrorCode::TooBig)
        );
    }
}
