//! The attribute flags' ioctls (`chattr`, `lsattr`, `xfs_io chattr`). The kernel sends
//! them as `FUSE_IOCTL` on a file it opens for the purpose (`fuse_fileattr_get`,
//! `fuse_fileattr_set`), after its own checks (the owner, `CAP_LINUX_IMMUTABLE`), with
//! exactly the struct's size in and out. Every other ioctl answers ENOTTY, what a file
//! that does not know the request answers (fuser's default logs a warning per call:
//! `lsattr`, `cp` and stress tools send them by the thousand).

use super::replies::finish;
use super::{errno_of, TesseraFs};
use crate::error::ClientError;
use fuser::{Errno, INodeNo, ReplyIoctl, Request};
use proto::InodeFlags;
use tracing::debug;

/// `FS_IOC_GETFLAGS`: `_IOR('f', 1, long)`, an `int` of flags.
const GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC_SETFLAGS`: `_IOW('f', 2, long)`.
const SETFLAGS: u32 = 0x4008_6602;
/// `FS_IOC32_GETFLAGS` and `FS_IOC32_SETFLAGS`, their 32-bit forms.
const GETFLAGS32: u32 = 0x8004_6601;
const SETFLAGS32: u32 = 0x4004_6602;
/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`.
const FSGETXATTR: u32 = 0x801C_581F;
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
const FSSETXATTR: u32 = 0x401C_5820;
/// `struct fsxattr`: `fsx_xflags`, `fsx_extsize`, `fsx_nextents`, `fsx_projid`,
/// `fsx_cowextsize` (each a `u32`), then 8 bytes of padding.
const FSXATTR_BYTES: usize = 28;

/// What an ioctl asks, decoded from its number and input.
#[derive(Debug, PartialEq, Eq)]
enum FlagsIoctl {
    /// Answer the flags as `FS_IOC_GETFLAGS` (`false`) or `FS_IOC_FSGETXATTR` (`true`).
    Get { fsxattr: bool },
    /// Set these flags; answer nothing.
    Set(InodeFlags),
}

/// Decodes ioctl `cmd` with input `data`: `Ok(None)` for an ioctl that is not about
/// flags (ENOTTY), an error for flags this file system does not keep (EOPNOTSUPP, as
/// ext4 answers for one it lacks) or a short input (EINVAL).
fn decode(cmd: u32, data: &[u8]) -> Result<Option<FlagsIoctl>, ClientError> {
    let word = |data: &[u8]| -> Result<u32, ClientError> {
        let bytes: [u8; 4] = data
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| ClientError::Invalid(format!("ioctl {cmd:#x}: {} bytes", data.len())))?;
        Ok(u32::from_ne_bytes(bytes))
    };
    let unsupported = |bits: u32| ClientError::NotSupported(format!("flags {bits:#x}"));
    Ok(Some(match cmd {
        GETFLAGS | GETFLAGS32 => FlagsIoctl::Get { fsxattr: false },
        FSGETXATTR => FlagsIoctl::Get { fsxattr: true },
        SETFLAGS | SETFLAGS32 => {
            FlagsIoctl::Set(InodeFlags::from_fs_flags(word(data)?).map_err(unsupported)?)
        }
        FSSETXATTR => {
            let Some(hints) = data.get(4..20).filter(|_| data.len() >= FSXATTR_BYTES) else {
                return Err(ClientError::Invalid(format!(
                    "fsxattr of {} bytes",
                    data.len()
                )));
            };
            // An extent size hint, a project or a copy-on-write hint: not kept.
            if hints.iter().any(|&b| b != 0) {
                return Err(ClientError::NotSupported("fsxattr hints or project".into()));
            }
            FlagsIoctl::Set(InodeFlags::from_xflags(word(data)?).map_err(unsupported)?)
        }
        _ => return Ok(None),
    }))
}

/// The reply's bytes to a get.
fn encode(flags: InodeFlags, fsxattr: bool) -> Vec<u8> {
    if !fsxattr {
        return flags.fs_flags().to_ne_bytes().to_vec();
    }
    let mut out = vec![0u8; FSXATTR_BYTES];
    out[..4].copy_from_slice(&flags.xflags().to_ne_bytes());
    out
}

impl TesseraFs {
    pub(super) fn ioctl_op(
        &self,
        req: &Request,
        i: INodeNo,
        cmd: u32,
        data: &[u8],
        reply: ReplyIoctl,
    ) {
        let ask = match decode(cmd, data) {
            Ok(Some(ask)) => ask,
            Ok(None) => {
                debug!(ino = i.0, cmd, "ioctl not supported");
                return reply.error(Errno::ENOTTY);
            }
            Err(e) => {
                debug!(ino = i.0, cmd, error = %e, "flags ioctl refused");
                return reply.error(errno_of(&e));
            }
        };
        let inner = self.inner.clone();
        let ino = super::replies::ino(i);
        self.spawn(req, async move {
            let client = &inner.client;
            match ask {
                FlagsIoctl::Get { fsxattr } => {
                    let r = client.getflags(ino).await;
                    finish(reply, r, |reply, f| reply.ioctl(0, &encode(f, fsxattr)))
                }
                FlagsIoctl::Set(flags) => {
                    let r = client.setflags(ino, flags).await;
                    finish(reply, r, |reply, _| reply.ioctl(0, &[]))
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_ioctls_decode_and_others_are_not_ours() {
        let set = |f: InodeFlags| Ok(Some(FlagsIoctl::Set(f)));
        let decode = |cmd, data: &[u8]| decode(cmd, data).map_err(|e| errno_of(&e));
        let immutable = InodeFlags {
            immutable: true,
            append: false,
        };
        let get = Ok(Some(FlagsIoctl::Get { fsxattr: false }));
        assert_eq!(decode(GETFLAGS, &[]), get);
        assert_eq!(decode(SETFLAGS, &0x10u32.to_ne_bytes()), set(immutable));
        assert_eq!(
            decode(SETFLAGS32, &0u32.to_ne_bytes()),
            set(InodeFlags::default())
        );
        // chattr +A (noatime) is not kept; a short input is malformed.
        assert_eq!(
            decode(SETFLAGS, &0x80u32.to_ne_bytes()),
            Err(Errno::EOPNOTSUPP)
        );
        assert_eq!(decode(SETFLAGS, &[0x10]), Err(Errno::EINVAL));
        let mut fsx = vec![0u8; FSXATTR_BYTES];
        fsx[..4].copy_from_slice(&InodeFlags::FS_XFLAG_IMMUTABLE.to_ne_bytes());
        assert_eq!(decode(FSSETXATTR, &fsx), set(immutable));
        fsx[12] = 1; // a project id
        assert_eq!(decode(FSSETXATTR, &fsx), Err(Errno::EOPNOTSUPP));
        assert_eq!(decode(FSSETXATTR, &fsx[..8]), Err(Errno::EINVAL));
        // FICLONE (a reflink) and FS_IOC_FIEMAP are someone else's.
        assert_eq!(decode(0x4004_9409, &[]), Ok(None));
        assert_eq!(decode(0xC020_660B, &[]), Ok(None));
    }

    #[test]
    fn gets_answer_the_structs_size() {
        let both = InodeFlags {
            immutable: true,
            append: true,
        };
        assert_eq!(encode(both, false), 0x30u32.to_ne_bytes().to_vec());
        let fsx = encode(both, true);
        assert_eq!(fsx.len(), FSXATTR_BYTES);
        assert_eq!(fsx[..4], 0x18u32.to_ne_bytes());
        assert!(fsx[4..].iter().all(|&b| b == 0));
    }
}
