//! The key schema. Integers are big-endian so that a scan visits them in numeric order.
//!
//! | key                  | value                                  |
//! | -------------------- | -------------------------------------- |
//! | `S`                  | superblock                             |
//! | `I` ino              | inode record                           |
//! | `D` parent name      | directory entry                        |
//! | `X` ino name         | extended attribute value; the flags under a name with a NUL |
//! | `N` node             | data server record                     |
//! | `G` node ino         | pending "delete all chunks of ino"     |
//! | `O` ino              | orphan: unlinked while open            |
//! | `T` ino              | a client vanished with the file open   |
//! | `C` chain            | replication chain: members and states  |
//! | `V`                  | cluster map version                    |
//! | `K` name             | client key: key id, capabilities, revoked |
//! | `R` version          | revoked client key: name, key id        |
//! | `F`                  | mark of the cluster key the client keys were made under |
//! | `H` ino              | a sparse regular file's chunks that hold data |
//! | `Q` client slot      | a client's change: its count and reply (see `once`) |
//! | `Y` shard            | on a shared engine, inodes made minus freed by the servers counting in this shard (`i64`) |
//! | `P` ino              | on a shared engine, the sessions of every server that have the file open, each with its server (see `opens`) |
//! | `W` ino              | on a shared engine, the file's byte-range and whole-file locks, each with its server (see `shared_locks`) |
//! | `E`                  | on a shared engine, the metadata server that leads (runs membership; see `leader`) |
//! | `L` server           | on a shared engine, a live metadata server, held under its engine lease (see `sweep`) |
//! | `Z` client           | a client that takes early replies (see `early`): empty |

use proto::{ChainId, InodeId, NodeId};

const SUPERBLOCK: u8 = b'S';
const INODE: u8 = b'I';
const DIRENT: u8 = b'D';
const XATTR: u8 = b'X';
const NODE: u8 = b'N';
const GC: u8 = b'G';
const ORPHAN: u8 = b'O';
const TAIL: u8 = b'T';
const CHAIN: u8 = b'C';
const MAP_VERSION: u8 = b'V';
const CLIENT_KEY: u8 = b'K';
const REVOCATION: u8 = b'R';
const CLUSTER_MARK: u8 = b'F';
const HELD: u8 = b'H';
const OP_RECORD: u8 = b'Q';
const INODE_COUNT: u8 = b'Y';
const OPENERS: u8 = b'P';
const SERVER: u8 = b'L';
const LOCKS: u8 = b'W';
const LEADER: u8 = b'E';
const EARLY_MARK: u8 = b'Z';

/// The mark of a client that takes early replies (see `early`).
pub(crate) fn early_mark(client: proto::ClientId) -> Vec<u8> {
    with(EARLY_MARK, &[&client.0.to_be_bytes()])
}

/// Prefix of every early-reply mark.
pub(crate) fn early_mark_prefix() -> Vec<u8> {
    vec![EARLY_MARK]
}

/// The key of shard `shard` of the inode count on a shared engine (see `txn`).
pub(crate) fn inode_count(shard: u8) -> Vec<u8> {
    vec![INODE_COUNT, shard]
}

/// Prefix of every shard of the inode count.
pub(crate) fn inode_count_prefix() -> Vec<u8> {
    vec![INODE_COUNT]
}

/// Prefix of every change record.
pub(crate) fn op_record_prefix() -> Vec<u8> {
    vec![OP_RECORD]
}

/// The key of slot `slot` of `client`'s change records.
pub(crate) fn op_record(client: proto::ClientId, slot: u64) -> Vec<u8> {
    with(OP_RECORD, &[&client.0.to_be_bytes(), &slot.to_be_bytes()])
}

/// The key of the cluster key's mark (a MAC under it; the key itself is not stored).
pub(crate) fn cluster_mark() -> Vec<u8> {
    vec![CLUSTER_MARK]
}

/// Prefix of every client key record.
pub(crate) fn client_key_prefix() -> Vec<u8> {
    vec![CLIENT_KEY]
}

/// A client key record's key.
pub(crate) fn client_key(name: &str) -> Vec<u8> {
    with(CLIENT_KEY, &[name.as_bytes()])
}

/// A revocation's key: its version, big-endian so that a scan visits them in order.
pub(crate) fn revocation(version: u64) -> Vec<u8> {
    with(REVOCATION, &[&version.to_be_bytes()])
}

/// Past the last revocation's key.
pub(crate) fn revocation_end() -> Vec<u8> {
    vec![REVOCATION + 1]
}

/// The version in a revocation's key.
pub(crate) fn revocation_version(key: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    if let Some(bytes) = key.get(1..9) {
        v.copy_from_slice(bytes);
    }
    u64::from_be_bytes(v)
}

fn with(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    let len = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut k = Vec::with_capacity(len);
    k.push(tag);
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

/// The superblock's key.
pub(crate) fn superblock() -> Vec<u8> {
    vec![SUPERBLOCK]
}

/// An inode record's key.
pub(crate) fn inode(ino: InodeId) -> Vec<u8> {
    with(INODE, &[&ino.0.to_be_bytes()])
}

/// Prefix of every entry of directory `parent`.
pub(crate) fn dirent_prefix(parent: InodeId) -> Vec<u8> {
    with(DIRENT, &[&parent.0.to_be_bytes()])
}

/// The key of entry `name` in directory `parent`.
pub(crate) fn dirent(parent: InodeId, name: &[u8]) -> Vec<u8> {
    with(DIRENT, &[&parent.0.to_be_bytes(), name])
}

/// Prefix of every extended attribute of `ino`.
pub(crate) fn xattr_prefix(ino: InodeId) -> Vec<u8> {
    with(XATTR, &[&ino.0.to_be_bytes()])
}

/// Prefix of every extended attribute of every inode.
pub(crate) fn xattr_all_prefix() -> Vec<u8> {
    vec![XATTR]
}

/// The key of extended attribute `name` of `ino`.
pub(crate) fn xattr(ino: InodeId, name: &[u8]) -> Vec<u8> {
    with(XATTR, &[&ino.0.to_be_bytes(), name])
}

/// Prefix of every data server record.
pub(crate) fn node_prefix() -> Vec<u8> {
    vec![NODE]
}

/// A data server record's key.
pub(crate) fn node(node: NodeId) -> Vec<u8> {
    with(NODE, &[&node.0.to_be_bytes()])
}

/// Prefix of every pending deletion on data server `node`.
pub(crate) fn gc_prefix(node: NodeId) -> Vec<u8> {
    with(GC, &[&node.0.to_be_bytes()])
}

/// The key of the pending deletion of `ino`'s chunks on `node`.
pub(crate) fn gc(node: NodeId, ino: InodeId) -> Vec<u8> {
    with(GC, &[&node.0.to_be_bytes(), &ino.0.to_be_bytes()])
}

/// Prefix of every inode record.
pub(crate) fn inode_prefix() -> Vec<u8> {
    vec![INODE]
}

/// Prefix of every directory entry.
pub(crate) fn dirent_all_prefix() -> Vec<u8> {
    vec![DIRENT]
}

/// Prefix of every chain record.
pub(crate) fn chain_prefix() -> Vec<u8> {
    vec![CHAIN]
}

/// A chain record's key.
pub(crate) fn chain(chain: ChainId) -> Vec<u8> {
    with(CHAIN, &[&chain.0.to_be_bytes()])
}

/// The cluster map version's key.
pub(crate) fn map_version() -> Vec<u8> {
    vec![MAP_VERSION]
}

/// The key of the sessions that have `ino` open, on a shared engine.
pub(crate) fn openers(ino: InodeId) -> Vec<u8> {
    with(OPENERS, &[&ino.0.to_be_bytes()])
}

/// Prefix of every openers key.
pub(crate) fn openers_prefix() -> Vec<u8> {
    vec![OPENERS]
}

/// The key naming the leader among the metadata servers of a shared engine.
pub(crate) fn leader() -> Vec<u8> {
    vec![LEADER]
}

/// The key of `ino`'s locks, on a shared engine.
pub(crate) fn locks(ino: InodeId) -> Vec<u8> {
    with(LOCKS, &[&ino.0.to_be_bytes()])
}

/// Prefix of every locks key.
pub(crate) fn locks_prefix() -> Vec<u8> {
    vec![LOCKS]
}

/// The key a live metadata server on a shared engine holds (see `sweep`).
pub(crate) fn server(id: u64) -> Vec<u8> {
    with(SERVER, &[&id.to_be_bytes()])
}

/// Prefix of every live server's key.
pub(crate) fn server_prefix() -> Vec<u8> {
    vec![SERVER]
}

/// Whether `key` is a live server's key.
pub(crate) fn is_server(key: &[u8]) -> bool {
    key.len() == 9 && key[0] == SERVER
}

/// Prefix of every orphan key.
pub(crate) fn orphan_prefix() -> Vec<u8> {
    vec![ORPHAN]
}

/// The orphan key of `ino`.
pub(crate) fn orphan(ino: InodeId) -> Vec<u8> {
    with(ORPHAN, &[&ino.0.to_be_bytes()])
}

/// The mark of `ino` saying that a client vanished while it had the file open: its
/// chunks may hold bytes past the committed length (see `proto::meta::fs::Opened::cut_tail`).
pub(crate) fn tail(ino: InodeId) -> Vec<u8> {
    with(TAIL, &[&ino.0.to_be_bytes()])
}

/// The key of the chunks of regular file `ino` that hold data (absent: every chunk
/// below its length).
pub(crate) fn held(ino: InodeId) -> Vec<u8> {
    with(HELD, &[&ino.0.to_be_bytes()])
}

/// Prefix of every held-chunks key.
pub(crate) fn held_prefix() -> Vec<u8> {
    vec![HELD]
}

/// The smallest key greater than every key that starts with `prefix`: the scan end.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only a prefix of all 0xff bytes gets here; no key of ours has one, and a key of
    // 0xff bytes longer than any we write bounds it.
    vec![0xff; prefix.len() + 64]
}

/// The smallest key strictly greater than `key`: where a scan resumes after it.
pub(crate) fn successor(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    k
}

/// Reads a big-endian u64 at `at` of `key`, for ids embedded in keys.
pub(crate) fn u64_at(key: &[u8], at: usize) -> Option<u64> {
    let bytes = key.get(at..at + 8)?;
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// Reads a big-endian u32 at `at` of `key`.
pub(crate) fn u32_at(key: &[u8], at: usize) -> Option<u32> {
    let bytes = key.get(at..at + 4)?;
    Some(u32::from_be_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_by_number_then_name() {
        assert!(inode(InodeId(255)) < inode(InodeId(256)));
        assert!(dirent(InodeId(1), b"zz") < dirent(InodeId(2), b""));
        assert!(dirent(InodeId(1), b"a") < dirent(InodeId(1), b"a\0"));
        assert!(dirent(InodeId(1), &[0xff; 300]) < prefix_end(&dirent_prefix(InodeId(1))));
        assert!(gc(NodeId(1), InodeId(u64::MAX)) < gc_prefix(NodeId(2)));
    }

    #[test]
    fn prefix_end_and_successor_bound_scans() {
        assert_eq!(prefix_end(&[1, 2, 0xff]), vec![1, 3]);
        assert_eq!(prefix_end(&[0xff, 0xff]).len(), 66);
        assert_eq!(successor(b"ab"), b"ab\0".to_vec());
        let k = gc(NodeId(7), InodeId(9));
        assert_eq!(u32_at(&k, 1), Some(7));
        assert_eq!(u64_at(&k, 5), Some(9));
        assert_eq!(u64_at(&k, 6), None);
    }
}
