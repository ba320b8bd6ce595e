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

use proto::meta::{fs, Caller, MetaRequest, OpenAccess, XattrMode};
use proto::TimeSet;
use proto::{ClientId, ErrorCode, InodeId, ProtoError, Request, Rpc, SetAttr, WireError};
use std::path::Path;
use tessera_tests::posix::{file_owned, mkdir_owned, open_to_all, User, ALICE_UID, BOB_UID};
use tessera_tests::InProcessCluster;
use transport::{Connection, Endpoint, TransportError};

/// Why a wire call was refused: the server's code. Anything else fails the test.
#[derive(Debug, PartialEq, Eq)]
struct Refused(ErrorCode);

impl From<WireError> for Refused {
    fn from(e: WireError) -> Refused {
        Refused(e.code)
    }
}

impl From<TransportError> for Refused {
    fn from(e: TransportError) -> Refused {
        panic!("the connection failed: {e}")
    }
}

impl From<ProtoError> for Refused {
    fn from(e: ProtoError) -> Refused {
        panic!("the codec failed: {e}")
    }
}

/// A hand-made client: one connection to the metadata server, no kernel, no caches.
struct Wire {
    conn: Connection,
    client: ClientId,
    _ep: Endpoint,
}

impl Wire {
    async fn connect(cluster: &InProcessCluster) -> Wire {
        // Authenticated as the cluster's administrator (no root squash): the user each
        // call names is what the server judges.
        let ep = cluster.endpoint();
        let conn = ep
            .connect(&cluster.meta_addr())
            .await
            .expect("connect to the metadata server");
        let mut wire = Wire {
            conn,
            client: ClientId(0),
            _ep: ep,
        };
        let hello = fs::Hello {
            name: "wire_perms".into(),
        };
        wire.client = wire.call(&Caller::NOBODY, hello).await.expect("hello");
        wire
    }

    /// Sends `req` made for `who`.
    async fn call<R: Rpc<Envelope = MetaRequest>>(
        &self,
        who: &Caller,
        req: R,
    ) -> Result<R::Reply, Refused> {
        let req = Request::new(req).with_caller(who.clone());
        transport::rpc::call(&self.conn, &req, 1 << 17).await
    }

    async fn mkdir(&self, who: &Caller, parent: InodeId, name: &str, perm: u32) -> InodeId {
        let name = name.as_bytes().to_vec();
        let made = self.call(who, fs::Mkdir { parent, name, perm }).await;
        made.expect("mkdir").attr.ino
    }

    /// Creates (and closes) a file owned by `who`.
    async fn create(&self, who: &Caller, parent: InodeId, name: &str, perm: u32) -> InodeId {
        let req = fs::Create {
            parent,
            name: name.as_bytes().to_vec(),
            perm,
            exclusive: true,
            client: self.client,
            access: OpenAccess::ReadWrite,
        };
        let opened = self.call(who, req).await.expect("create");
        assert_eq!(opened.attr.uid, who.uid, "the caller owns what it makes");
        self.close(opened.session).await;
        opened.attr.ino
    }

    async fn close(&self, session: proto::SessionId) {
        let release = fs::Release {
            session,
            commit: None,
        };
        self.call(&Caller::ROOT, release).await.expect("release");
    }

    async fn open_for_write(&self, who: &Caller, ino: InodeId) -> Result<(), Refused> {
        let req = fs::Open {
            ino,
            client: self.client,
            truncate: false,
            access: OpenAccess::Write,
        };
        let opened = self.call(who, req).await?;
        self.close(opened.session).await;
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
    let r: Result<_, Refused> = transport::rpc::call(&w.conn, &req, 1 << 17).await;
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
