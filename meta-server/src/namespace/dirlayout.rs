//! Layout settings of a directory, kept as extended attributes so that `getfattr` and
//! `setfattr` show and change them and `cp -a` / `rsync -X` carry them:
//!
//! - `user.tessera.replicas`: copies of each chunk for new files, `1` to `8` (capped by
//!   the number of data servers, like the server-wide `replicas`);
//! - `user.tessera.chunk_size`: chunk size in bytes for new files, a power of two from
//!   64 KiB to 64 MiB.
//!
//! Both are decimal text. A new file takes them from its directory (else the server's
//! configuration), a new subdirectory copies them; existing files keep their layout.

use super::keys;
use super::records::{decode, InodeRecord};
use super::txn::{Reads, Txn};
use crate::config::NamespaceConfig;
use crate::error::MetaError;
use proto::InodeId;

/// Replication factor of new files.
pub(crate) const REPLICAS: &[u8] = b"user.tessera.replicas";
/// Chunk size of new files.
pub(crate) const CHUNK_SIZE: &[u8] = b"user.tessera.chunk_size";

fn number(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// Refuses a value that is not a valid setting (other names pass).
pub(crate) fn check(name: &[u8], value: &[u8]) -> Result<(), MetaError> {
    let bad = |what: &str| {
        Err(MetaError::InvalidArgument(format!(
            "{} must be {what}",
            String::from_utf8_lossy(name)
        )))
    };
    if name == REPLICAS && !number(value).is_some_and(|n| (1..=8).contains(&n)) {
        return bad("a number from 1 to 8");
    }
    if name == CHUNK_SIZE
        && !number(value).is_some_and(|n| {
            n.is_power_of_two()
                && (u64::from(NamespaceConfig::MIN_CHUNK_SIZE_BYTES)
                    ..=u64::from(NamespaceConfig::MAX_CHUNK_SIZE_BYTES))
                    .contains(&n)
        })
    {
        return bad("a power of two from 65536 to 67108864");
    }
    Ok(())
}

fn setting(txn: &Txn<'_>, dir: InodeId, name: &[u8]) -> Result<Option<u64>, MetaError> {
    match txn.raw(&keys::xattr(dir, name))? {
        Some(v) => Ok(number(&decode::<Vec<u8>>(&v, "xattr")?)),
        None => Ok(None),
    }
}

/// Replicas and chunk size for a new file in `dir`.
pub(crate) fn for_new_file(
    txn: &Txn<'_>,
    dir: InodeId,
    config: &NamespaceConfig,
) -> Result<(u8, u32), MetaError> {
    let replicas = setting(txn, dir, REPLICAS)?
        .and_then(|n| u8::try_from(n).ok())
        .unwrap_or(config.replicas);
    let chunk = setting(txn, dir, CHUNK_SIZE)?
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(config.chunk_size_bytes);
    Ok((replicas, chunk))
}

/// Copies the settings of `parent` to the new directory `child`.
pub(crate) fn inherit(
    txn: &mut Txn<'_>,
    parent: InodeId,
    child: InodeId,
    rec: &mut InodeRecord,
) -> Result<(), MetaError> {
    for name in [REPLICAS, CHUNK_SIZE] {
        if let Some(v) = txn.raw(&keys::xattr(parent, name))? {
            txn.put(keys::xattr(child, name), v.to_vec());
            rec.xattr_count += 1;
        }
    }
    Ok(())
}
