//! What each file-system request does, in one table: whether it changes the file system
//! (a read-only client is refused it) and which inodes it names (a client scoped to a
//! directory may name only inodes inside it). Both matches are exhaustive with no `_`
//! arm, so a new request type cannot be added without deciding both.

use super::fs::FsRequest;
use super::{LockKind, LockSpec, OpenAccess, RenameMode, XattrMode};
use crate::attr::{FileKind, Timestamp};
use crate::ids::{ClientId, InodeId, SessionId};

impl FsRequest {
    /// Whether the request changes the file system: data, attributes, names, extended
    /// attributes, or a file's length. A read-only client gets EROFS for it.
    pub fn changes(&self) -> bool {
        use FsRequest as F;
        match self {
            F::Create(_)
            | F::TmpFile(_)
            | F::MkNod(_)
            | F::Mkdir(_)
            | F::Symlink(_)
            | F::Link(_)
            | F::Unlink(_)
            | F::Rmdir(_)
            | F::Rename(_)
            | F::SetAttr(_)
            | F::SetXattr(_)
            | F::RemoveXattr(_)
            | F::SetFlags(_)
            | F::Append(_)
            | F::Commit(_)
            // An access time is a change too; a read-only mount sends none (`ro`
            // implies `noatime`).
            | F::Accessed(_) => true,
            F::Open(r) => r.truncate || r.access.writes(),
            // An access time is a change (see `Accessed` above).
            F::OpenAt(r) => r.access.writes() || r.accessed.is_some(),
            F::Release(r) => r.commit.is_some(),
            F::Hello(_)
            | F::Lookup(_)
            | F::GetAttr(_)
            | F::Readlink(_)
            | F::ReadDir(_)
            | F::StatFs(_)
            | F::ReleaseMany(_)
            | F::GetXattr(_)
            | F::ListXattr(_)
            | F::GetFlags(_)
            // Locks change no file (a write lock needs a descriptor open for writing,
            // which a read-only client cannot get).
            | F::SetLock(_)
            | F::GetLock(_)
            | F::ReleaseLocks(_)
            // Cutting a vanished writer's tail takes away only bytes past the committed
            // length, which no reader sees: a read-only key's open makes it too.
            | F::TailCut(_)
            | F::Resume(_)
            | F::MyCaps(_)
            | F::Settle(_)
            // A renewed grant has its session's mode: a read-only key's is a read grant.
            | F::Regrant(_)
            | F::LookupParent(_) => false,
        }
    }

    /// Every inode the request names, to be checked (and, for a scoped client, mapped)
    /// before it is served. Sessions are not inodes: they belong to their connection.
    pub fn inodes_mut(&mut self) -> Vec<&mut InodeId> {
        use FsRequest as F;
        match self {
            F::Hello(_)
            | F::StatFs(_)
            | F::Release(_)
            | F::ReleaseMany(_)
            | F::MyCaps(_)
            | F::Settle(_)
            | F::Regrant(_) => Vec::new(),
            F::Lookup(r) => vec![&mut r.parent],
            F::LookupParent(r) => vec![&mut r.dir],
            F::OpenAt(r) => vec![&mut r.parent],
            F::GetAttr(r) => vec![&mut r.ino],
            F::SetAttr(r) => vec![&mut r.ino],
            F::Create(r) => vec![&mut r.parent],
            F::TmpFile(r) => vec![&mut r.parent],
            F::MkNod(r) => vec![&mut r.parent],
            F::Mkdir(r) => vec![&mut r.parent],
            F::Symlink(r) => vec![&mut r.parent],
            F::Readlink(r) => vec![&mut r.ino],
            F::Link(r) => vec![&mut r.ino, &mut r.new_parent],
            F::Unlink(r) => vec![&mut r.parent],
            F::Rmdir(r) => vec![&mut r.parent],
            F::Rename(r) => vec![&mut r.parent, &mut r.new_parent],
            F::ReadDir(r) => vec![&mut r.ino],
            F::Open(r) => vec![&mut r.ino],
            F::Commit(r) => vec![&mut r.ino],
            F::TailCut(r) => vec![&mut r.ino],
            F::GetXattr(r) => vec![&mut r.ino],
            F::SetXattr(r) => vec![&mut r.ino],
            F::ListXattr(r) => vec![&mut r.ino],
            F::RemoveXattr(r) => vec![&mut r.ino],
            F::GetFlags(r) => vec![&mut r.ino],
            F::SetFlags(r) => vec![&mut r.ino],
            F::Append(r) => vec![&mut r.ino],
            F::Accessed(r) => vec![&mut r.ino],
            F::SetLock(r) => vec![&mut r.ino],
            F::GetLock(r) => vec![&mut r.ino],
            F::ReleaseLocks(r) => vec![&mut r.ino],
            F::Resume(r) => r.sessions.iter_mut().map(|s| &mut s.ino).collect(),
        }
    }
}

/// One request of every kind, naming directory `dir` and file `file` (an open for
/// writing, a release with a commit): for tests that must cover each kind, which
/// `every_kind_is_sampled` keeps true.
#[doc(hidden)]
pub fn one_of_each(dir: InodeId, file: InodeId, client: ClientId) -> Vec<FsRequest> {
    use super::fs::*;
    let name = |n: &str| n.as_bytes().to_vec();
    let commit = super::Commit::length(1, Timestamp { secs: 1, nanos: 0 });
    let lock = LockSpec {
        owner: 1,
        pid: 1,
        start: 0,
        end: u64::MAX,
        kind: LockKind::Read,
    };
    let access = OpenAccess::ReadWrite;
    let sessions = vec![OpenSession {
        session: SessionId(1),
        ino: file,
        writes: true,
        grant: None,
    }];
    vec![
        FsRequest::Hello(Hello { name: "t".into() }),
        FsRequest::Lookup(Lookup {
            parent: dir,
            name: name("f"),
        }),
        FsRequest::GetAttr(GetAttr { ino: file }),
        FsRequest::SetAttr(SetAttr {
            ino: file,
            set: Default::default(),
            commit: None,
        }),
        FsRequest::Create(Create {
            parent: dir,
            name: name("n"),
            perm: 0o644,
            exclusive: true,
            access,
            append: false,
            client,
        }),
        FsRequest::TmpFile(TmpFile {
            parent: dir,
            perm: 0o600,
            linkable: true,
            access,
            client,
        }),
        FsRequest::MkNod(MkNod {
            parent: dir,
            name: name("p"),
            kind: FileKind::Fifo,
            perm: 0o644,
            rdev: 0,
        }),
        FsRequest::Mkdir(Mkdir {
            parent: dir,
            name: name("d"),
            perm: 0o755,
        }),
        FsRequest::Symlink(Symlink {
            parent: dir,
            name: name("s"),
            target: name("f"),
        }),
        FsRequest::Readlink(Readlink { ino: file }),
        FsRequest::Link(Link {
            ino: file,
            new_parent: dir,
            new_name: name("l"),
            kernel_checked: false,
        }),
        FsRequest::Unlink(Unlink {
            parent: dir,
            name: name("f"),
        }),
        FsRequest::Rmdir(Rmdir {
            parent: dir,
            name: name("d"),
        }),
        FsRequest::Rename(Rename {
            parent: dir,
            name: name("f"),
            new_parent: dir,
            new_name: name("g"),
            mode: RenameMode::Replace,
        }),
        FsRequest::ReadDir(ReadDir {
            ino: dir,
            after: None,
            max_entries: 8,
            plus: true,
        }),
        FsRequest::StatFs(StatFs),
        FsRequest::Open(Open {
            ino: file,
            client,
            truncate: false,
            access,
            append: false,
        }),
        FsRequest::Commit(Commit {
            ino: file,
            commit: commit.clone(),
        }),
        FsRequest::Release(Release {
            session: SessionId(1),
            commit: Some(commit),
        }),
        FsRequest::TailCut(TailCut {
            ino: file,
            session: SessionId(1),
        }),
        FsRequest::ReleaseMany(ReleaseMany {
            sessions: vec![SessionId(1)],
        }),
        FsRequest::GetXattr(GetXattr {
            ino: file,
            name: name("user.a"),
        }),
        FsRequest::SetXattr(SetXattr {
            ino: file,
            name: name("user.a"),
            value: name("v"),
            mode: XattrMode::Upsert,
        }),
        FsRequest::ListXattr(ListXattr { ino: file }),
        FsRequest::RemoveXattr(RemoveXattr {
            ino: file,
            name: name("user.a"),
        }),
        FsRequest::Append(Append { ino: file, len: 1 }),
        FsRequest::Accessed(Accessed {
            ino: file,
            strict: true,
        }),
        FsRequest::SetLock(SetLock {
            ino: file,
            client,
            lock,
            reclaim: false,
            waits: true,
        }),
        FsRequest::GetLock(GetLock {
            ino: file,
            client,
            lock,
        }),
        FsRequest::ReleaseLocks(ReleaseLocks {
            ino: file,
            client,
            owner: 1,
        }),
        FsRequest::Resume(Resume { client, sessions }),
        FsRequest::MyCaps(MyCaps),
        FsRequest::Regrant(Regrant {
            session: SessionId(1),
        }),
        FsRequest::LookupParent(LookupParent { dir }),
        FsRequest::OpenAt(OpenAt {
            parent: dir,
            name: name("f"),
            client,
            access,
            accessed: Some(false),
            append: false,
        }),
        FsRequest::GetFlags(GetFlags { ino: file }),
        FsRequest::SetFlags(SetFlags {
            ino: file,
            flags: crate::attr::InodeFlags::default(),
        }),
        FsRequest::Settle(Settle { client }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Guards against a request kind that `one_of_each` (and so the wire tests of
    /// read-only and scoped keys) forgets.
    #[test]
    fn every_kind_is_sampled() {
        let all = one_of_each(InodeId(2), InodeId(3), ClientId(1));
        let sampled: BTreeSet<&str> = all.iter().map(|r| r.name()).collect();
        let table: BTreeSet<&str> = FsRequest::NAMES.iter().copied().collect();
        assert_eq!(sampled, table);
        assert_eq!(all.len(), FsRequest::NAMES.len());
    }

    /// Guards against a change slipping past a read-only key, or a read being refused.
    #[test]
    fn the_changes_are_the_writes() {
        let changing: BTreeSet<&str> = one_of_each(InodeId(2), InodeId(3), ClientId(1))
            .iter()
            .filter(|r| r.changes())
            .map(|r| r.name())
            .collect();
        let expected = [
            "setattr",
            "create",
            "tmpfile",
            "mknod",
            "mkdir",
            "symlink",
            "link",
            "unlink",
            "rmdir",
            "rename",
            "open",
            "commit",
            "release",
            "setxattr",
            "removexattr",
            "setflags",
            "append",
            "accessed",
            "open_at",
        ];
        assert_eq!(changing, expected.into_iter().collect());
        let read = FsRequest::Open(super::super::fs::Open {
            ino: InodeId(3),
            client: ClientId(1),
            truncate: false,
            access: super::super::OpenAccess::Read,
            append: false,
        });
        assert!(!read.changes(), "an open for reading changes nothing");
        let read_at = FsRequest::OpenAt(super::super::fs::OpenAt {
            parent: InodeId(2),
            name: b"f".to_vec(),
            client: ClientId(1),
            access: super::super::OpenAccess::Read,
            accessed: None,
            append: false,
        });
        assert!(
            !read_at.changes(),
            "nor does one by name that moves no atime"
        );
    }

    /// Guards against an inode a request names escaping the scope check.
    #[test]
    fn every_inode_field_is_named() {
        for mut req in one_of_each(InodeId(2), InodeId(3), ClientId(1)) {
            let named: Vec<u64> = req.inodes_mut().into_iter().map(|i| i.0).collect();
            let shown = format!("{req:?}");
            let in_fields = shown.matches("InodeId(").count();
            assert_eq!(named.len(), in_fields, "{shown}");
        }
    }
}
