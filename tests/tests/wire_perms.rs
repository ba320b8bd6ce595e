//! A client that speaks the wire itself (no mount, no kernel checks), naming an
//! unprivileged user, gets from the metadata server what that user gets from a local
//! file system: the same steps, run as that user against a local directory (through
//! `setpriv`, no capabilities), give the same errno; the test runs both and compares.
//! Observed on ext4 (Linux 6.18), as user 4343 on files of root and of user 4242:
//!
//! | step | errno |
//! | --- | --- |
//! | unlink a file of another user in a sticky 1777 directory | EPERM |
//! | unlink a file in a 755 directory of root | EACCES |
//! | open for writing a 0600 file of root | EACCES |
//! | chmod a file of another user | EPERM |
//! | chown a file of another user | EPERM |
//! | setxattr `trusted.x` | EPERM |

use proto::meta::{fs, Caller, LockKind, LockSpec, MetaRequest, OpenAccess, XattrMode};
use proto::TimeSet;
use proto::{ErrorCode, InodeId, Request, Rpc, SetAttr, WireError};
use std::path::Path;
use tessera_tests::posix::{file_owned, mkdir_owned, open_to_all, User, ALICE_UID, BOB_UID};
use tessera_tests::wire::WireClient;
use tessera_tests::InProcessCluster;

/// Why a wire call was refused: the server's code.
#[derive(Debug, PartialEq, Eq)]
struct Refused(ErrorCode);

impl From<WireError> for Refused {
    fn from(e: WireError) -> Refused {
        Refused(e.code)
    }
}

/// The administrator's wire client (no root squash): the user each call names is what
/// the server judges.
struct Wire(WireClient);

impl Wire {
    async fn connect(cluster: &InProcessCluster) -> Wire {
        Wire(WireClient::admin(cluster, "wire_perms").await)
    }

    /// Sends `req` made for `who`.
    async fn call<R: Rpc<Envelope = MetaRequest>>(
        &self,
        who: &Caller,
        req: R,
    ) -> Result<R::Reply, Refused> {
        Ok(self.0.call(who, req).await?)
    }

    async fn mkdir(&self, who: &Caller, parent: InodeId, name: &str, perm: u32) -> InodeId {
        self.0.mkdir(who, parent, name, perm).await
    }

    /// Creates (and closes) a file owned by `who`.
    async fn create(&self, who: &Caller, parent: InodeId, name: &str, perm: u32) -> InodeId {
        let attr = self.0.create(who, parent, name, perm).await;
        assert_eq!(attr.uid, who.uid, "the caller owns what it makes");
        attr.ino
    }

    async fn open_for_write(&self, who: &Caller, ino: InodeId) -> Result<(), Refused> {
        let req = fs::Open {
            ino,
            client: self.0.client,
            truncate: false,
            access: OpenAccess::Write,
            append: false,
        };
        let opened = self.call(who, req).await?;
        self.0.close(&Caller::ROOT, opened.session).await;
        Ok(())
    }

    async fn setattr(&self, who: &Caller, ino: InodeId, set: SetAttr) -> Result<(), Refused> {
        let req = fs::SetAttr {
            ino,
            set,
            commit: None,
        };
        self.call(who, req).await.map(drop)
    }
}

/// The errno name an application would see for a wire result.
fn outcome(r: Result<(), Refused>) -> String {
    match r {
        Ok(()) => "OK".into(),
        Err(Refused(ErrorCode::PermissionDenied)) => "EACCES".into(),
        Err(Refused(ErrorCode::NotPermitted)) => "EPERM".into(),
        Err(Refused(code)) => format!("{code:?}"),
    }
}

/// The steps, as `(label, errno a local file system gives)`.
const STEPS: [(&str, &str); 6] = [
    ("unlink_sticky", "EPERM"),
    ("unlink_755", "EACCES"),
    ("open_write_0600", "EACCES"),
    ("chmod", "EPERM"),
    ("chown", "EPERM"),
    ("setxattr_trusted", "EPERM"),
];

/// The steps as user `BOB_UID` against a local directory laid out as the cluster is.
fn local_outcomes(root: &Path) -> Vec<(String, String)> {
    open_to_all(root);
    mkdir_owned(&root.join("tmp"), 0o1777, 0, 0);
    file_owned(&root.join("tmp/a"), b"a", 0o644, ALICE_UID, ALICE_UID);
    mkdir_owned(&root.join("home"), 0o755, 0, 0);
    file_owned(&root.join("home/f"), b"f", 0o644, 0, 0);
    file_owned(&root.join("secret"), b"s", 0o600, 0, 0);
    let script = format!(
        r#"
p = sys.argv[1]
t("unlink_sticky", os.unlink, p + "/tmp/a")
t("unlink_755", os.unlink, p + "/home/f")
t("open_write_0600", wr, p + "/secret")
t("chmod", os.chmod, p + "/tmp/a", 0o777)
t("chown", os.chown, p + "/tmp/a", {BOB_UID}, -1)
t("setxattr_trusted", os.setxattr, p + "/tmp/a", "trusted.x", b"1")
"#
    );
    let out = User::plain(BOB_UID).py(&script, &[root]);
    STEPS
        .iter()
        .map(|(label, _)| (label.to_string(), out.get(label).to_string()))
        .collect()
}

/// Guards against the metadata server trusting the client's kernel: a wire client
/// named an unprivileged user unlinked and changed other users' files (issue 23).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wire_client_gets_what_a_local_file_system_gives_an_unprivileged_user() {
    let local = tempfile::tempdir().unwrap();
    let local_seen = local_outcomes(local.path());

    let cluster = InProcessCluster::start(1).await;
    let w = Wire::connect(&cluster).await;
    let (root, alice, bob) = (
        Caller::ROOT,
        Caller::new(ALICE_UID, ALICE_UID),
        Caller::new(BOB_UID, BOB_UID),
    );
    let top = InodeId::ROOT;
    let tmp = w.mkdir(&root, top, "tmp", 0o1777).await;
    let a = w.create(&alice, tmp, "a", 0o644).await;
    let home = w.mkdir(&root, top, "home", 0o755).await;
    w.create(&root, home, "f", 0o644).await;
    let secret = w.create(&root, top, "secret", 0o600).await;

    let unlink = |parent, name: &str| fs::Unlink {
        parent,
        name: name.as_bytes().to_vec(),
    };
    let chmod = |perm| SetAttr {
        perm: Some(perm),
        ..SetAttr::default()
    };
    let chown = |uid| SetAttr {
        uid: Some(uid),
        ..SetAttr::default()
    };
    let trusted = || fs::SetXattr {
        ino: a,
        name: b"trusted.x".to_vec(),
        value: b"1".to_vec(),
        mode: XattrMode::Upsert,
    };
    let wire_seen = [
        (
            "unlink_sticky",
            w.call(&bob, unlink(tmp, "a")).await.map(drop),
        ),
        (
            "unlink_755",
            w.call(&bob, unlink(home, "f")).await.map(drop),
        ),
        ("open_write_0600", w.open_for_write(&bob, secret).await),
        ("chmod", w.setattr(&bob, a, chmod(0o777)).await),
        ("chown", w.setattr(&bob, a, chown(BOB_UID)).await),
        ("setxattr_trusted", w.call(&bob, trusted()).await),
    ];
    for (((label, want), (local_label, local)), (_, wire)) in
        STEPS.iter().zip(&local_seen).zip(wire_seen)
    {
        assert_eq!(label, local_label);
        assert_eq!(local, want, "{label}: the local file system");
        assert_eq!(outcome(wire), *want, "{label}: the wire client");
    }

    // The same steps by the owner, or root, succeed.
    w.setattr(&alice, a, chmod(0o600)).await.unwrap();
    w.setattr(&root, a, chown(BOB_UID)).await.unwrap();
    w.call(&root, trusted()).await.unwrap();
    w.open_for_write(&root, secret).await.unwrap();
    w.call(&root, unlink(home, "f")).await.unwrap();
    // Bob owns `a` now: the sticky directory lets him remove it.
    w.call(&bob, unlink(tmp, "a")).await.unwrap();
}

/// Guards against a request that names no caller being served as root: it is made
/// for nobody, who may not add a name to root's 755 directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_naming_no_caller_is_made_for_nobody() {
    let cluster = InProcessCluster::start(1).await;
    let w = Wire::connect(&cluster).await;
    let req = Request::new(fs::Mkdir {
        parent: InodeId::ROOT,
        name: b"d".to_vec(),
        perm: 0o777,
    });
    let r = w.0.send(&req).await.map_err(Refused::from);
    assert_eq!(r.map(drop), Err(Refused(ErrorCode::PermissionDenied)));
    // Nor may nobody set a time it does not own, or read root's trusted attributes.
    let f = w.create(&Caller::ROOT, InodeId::ROOT, "f", 0o666).await;
    let at = SetAttr {
        mtime: Some(TimeSet::At(proto::Timestamp { secs: 1, nanos: 0 })),
        ..SetAttr::default()
    };
    let nobody = Caller::NOBODY;
    let r = w.setattr(&nobody, f, at).await;
    assert_eq!(r, Err(Refused(ErrorCode::NotPermitted)));
    let now = SetAttr {
        mtime: Some(TimeSet::Now),
        ..SetAttr::default()
    };
    w.setattr(&nobody, f, now).await.unwrap();
    let get = fs::GetXattr {
        ino: f,
        name: b"trusted.x".to_vec(),
    };
    let r = w.call(&nobody, get).await.map(drop);
    assert_eq!(r, Err(Refused(ErrorCode::NoData)));
}

/// Guards against `Accessed` and `GetLock` serving any caller: an access time moved for
/// a user who may not read the file, and a lock was probed on a file the connection
/// had not opened (so whose open checks it never passed), unlike `SetLock`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn access_times_need_read_and_lock_probes_need_an_open_file() {
    let cluster = InProcessCluster::start(1).await;
    let w = Wire::connect(&cluster).await;
    let (root, bob) = (Caller::ROOT, Caller::new(BOB_UID, BOB_UID));
    let secret = w.create(&root, InodeId::ROOT, "secret", 0o600).await;
    let accessed = fs::Accessed {
        ino: secret,
        strict: true,
    };
    let r = w.call(&bob, accessed.clone()).await.map(drop);
    assert_eq!(outcome(r), "EACCES", "bob may not read root's 0600 file");
    w.call(&root, accessed).await.expect("root may");

    let probe = fs::GetLock {
        ino: secret,
        client: w.0.client,
        lock: LockSpec {
            owner: 1,
            pid: 1,
            start: 0,
            end: u64::MAX,
            kind: LockKind::Write,
        },
    };
    let r = w.call(&root, probe.clone()).await.map(drop);
    assert_eq!(
        r,
        Err(Refused(ErrorCode::Stale)),
        "not open on this connection"
    );
    let open = fs::Open {
        ino: secret,
        client: w.0.client,
        truncate: false,
        access: OpenAccess::Read,
        append: false,
    };
    let opened = w.call(&root, open).await.expect("open");
    assert_eq!(w.call(&root, probe).await, Ok(None), "open: answered");
    w.0.close(&root, opened.session).await;
}

/// An ACL's bytes as the kernel exchanges them (`posix_acl_xattr_header` version 2,
/// then tag, permission and id per entry), from `(tag, perm, id)` triples.
fn acl_bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

/// Guards against POSIX ACLs that only a mount's kernel applies: a client with no
/// kernel (the library) naming a user is judged by the file's ACL on the metadata
/// server, what it makes in a directory with a default ACL gets it (its umask set
/// aside), and a malformed or misplaced ACL is refused as Linux refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acls_are_applied_to_a_client_without_a_kernel() {
    const NONE: u32 = u32::MAX;
    let (user_obj, user, group_obj, mask, other) = (0x01, 0x02, 0x04, 0x10, 0x20);
    let cluster = InProcessCluster::start(1).await;
    let w = Wire::connect(&cluster).await;
    let (root, alice, bob) = (
        Caller::ROOT,
        Caller::new(ALICE_UID, ALICE_UID).with_umask(0o077),
        Caller::new(BOB_UID, BOB_UID),
    );
    let set = |ino, name: &[u8], value: Vec<u8>| fs::SetXattr {
        ino,
        name: name.to_vec(),
        value,
        mode: XattrMode::Upsert,
    };
    // A directory of root's, 0750, where Alice is named with rwx, as a default too.
    let dir = w.mkdir(&root, InodeId::ROOT, "proj", 0o750).await;
    let named = acl_bytes(&[
        (user_obj, 7, NONE),
        (user, 7, ALICE_UID),
        (group_obj, 5, NONE),
        (mask, 7, NONE),
        (other, 0, NONE),
    ]);
    let access = b"system.posix_acl_access";
    let default = b"system.posix_acl_default";
    let r = w.call(&bob, set(dir, access, named.clone())).await;
    assert_eq!(
        r,
        Err(Refused(ErrorCode::NotPermitted)),
        "only the owner sets it"
    );
    w.call(&root, set(dir, access, named.clone()))
        .await
        .unwrap();
    w.call(&root, set(dir, default, named.clone()))
        .await
        .unwrap();
    // The mask became the group bits: 0770.
    let attr = w.call(&root, fs::GetAttr { ino: dir }).await.unwrap();
    assert_eq!(attr.perm, 0o770);

    // Alice, named in the ACL, makes a file there; Bob, one of the others, may not.
    let f = w.create(&alice, dir, "f", 0o666).await;
    let made = w.call(&bob, fs::GetAttr { ino: f }).await.unwrap();
    assert_eq!(made.perm, 0o660, "the default ACL, not Alice's umask 077");
    let got = w
        .call(
            &root,
            fs::GetXattr {
                ino: f,
                name: access.to_vec(),
            },
        )
        .await;
    let want = acl_bytes(&[
        (user_obj, 6, NONE),
        (user, 7, ALICE_UID),
        (group_obj, 5, NONE),
        (mask, 6, NONE),
        (other, 0, NONE),
    ]);
    assert_eq!(
        got.unwrap(),
        want,
        "the default limited by the mode asked for"
    );
    let bob_creates = fs::Create {
        parent: dir,
        name: b"g".to_vec(),
        perm: 0o644,
        exclusive: true,
        access: OpenAccess::Write,
        append: false,
        client: w.0.client,
    };
    let r = w.call(&bob, bob_creates).await.map(drop);
    assert_eq!(r, Err(Refused(ErrorCode::PermissionDenied)));
    // Without a default ACL the umask applies.
    let plain = w.mkdir(&root, InodeId::ROOT, "plain", 0o777).await;
    let g = w.create(&alice, plain, "g", 0o666).await;
    let attr = w.call(&root, fs::GetAttr { ino: g }).await.unwrap();
    assert_eq!(attr.perm, 0o600, "Alice's umask 077");

    // Bob named in a file's ACL may write it; a chmod's mask takes that away.
    let secret = w.create(&root, InodeId::ROOT, "secret", 0o600).await;
    assert_eq!(
        w.open_for_write(&bob, secret).await,
        Err(Refused(ErrorCode::PermissionDenied))
    );
    let bob_rw = acl_bytes(&[
        (user_obj, 6, NONE),
        (user, 6, BOB_UID),
        (group_obj, 0, NONE),
        (mask, 6, NONE),
        (other, 0, NONE),
    ]);
    w.call(&root, set(secret, access, bob_rw)).await.unwrap();
    w.open_for_write(&bob, secret).await.unwrap();
    w.setattr(
        &root,
        secret,
        SetAttr {
            perm: Some(0o640),
            ..SetAttr::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        w.open_for_write(&bob, secret).await,
        Err(Refused(ErrorCode::PermissionDenied)),
        "the mask is r-- now"
    );

    // Malformed (no mask with a named entry), and a default ACL on a file.
    let no_mask = acl_bytes(&[
        (user_obj, 6, NONE),
        (user, 6, BOB_UID),
        (group_obj, 0, NONE),
        (other, 0, NONE),
    ]);
    let r = w.call(&root, set(secret, access, no_mask)).await;
    assert_eq!(r, Err(Refused(ErrorCode::InvalidArgument)));
    let r = w.call(&root, set(secret, default, named)).await;
    assert_eq!(r, Err(Refused(ErrorCode::PermissionDenied)));
}
