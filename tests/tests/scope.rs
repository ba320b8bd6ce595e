//! Client capabilities at the wire (issue 23 item 3): a hand-made client holding a key
//! scoped to `/teamA`, a read-only key, a root-squashing key and a key without the
//! admin capability, each asking the metadata server directly (no kernel, no mount) for
//! what its key must not give.

use proto::auth::Caps;
use proto::meta::admin::{CheckNamespace, KeyCreate, KeyList, Status};
use proto::meta::cluster::ListFiles;
use proto::meta::{fs, one_of_each, Caller, FsRequest, OpenAccess, NOBODY_ID};
use proto::{ErrorCode, InodeId};
use tessera_tests::wire::WireClient;
use tessera_tests::InProcessCluster;
use transport::{ClientKeyFile, Credentials, Key};

/// A wire client holding a key (the administrator's or one `with_key` made).
struct Wire(WireClient);

impl std::ops::Deref for Wire {
    type Target = WireClient;
    fn deref(&self) -> &WireClient {
        &self.0
    }
}

impl Wire {
    /// The cluster's administrator (every capability, no squash).
    async fn admin(cluster: &InProcessCluster) -> Wire {
        Wire(WireClient::admin(cluster, "scope test").await)
    }

    /// A new client key with `caps`, made by `admin` (replacing the name's key, if it
    /// had one), and a connection holding it.
    async fn with_key(cluster: &InProcessCluster, admin: &Wire, name: &str, caps: Caps) -> Wire {
        let cluster_key =
            Key::load(&cluster.key_file(tessera_tests::CLUSTER_KEY)).expect("cluster key");
        let key_id = transport::auth::new_key_id().expect("key id");
        let file = ClientKeyFile::derive(&cluster_key, name, key_id, caps.clone());
        let create = KeyCreate {
            name: name.into(),
            key_id,
            caps,
            replace: true,
        };
        admin.call(&Caller::ROOT, create).await.expect("key create");
        let ep = cluster
            .endpoint()
            .with_credentials(Credentials::client(file));
        Wire(WireClient::on(ep, cluster, "scope test").await)
    }

    /// Sends any file-system request; only whether it was refused, and how, matters.
    async fn any(&self, who: &Caller, req: FsRequest) -> Result<(), ErrorCode> {
        macro_rules! send {
            ($($k:ident),*) => {
                match req {
                    $( FsRequest::$k(r) => self.call(who, r).await.map(drop), )*
                }
            };
        }
        send!(
            Hello,
            Lookup,
            GetAttr,
            SetAttr,
            Create,
            TmpFile,
            MkNod,
            Mkdir,
            Symlink,
            Readlink,
            Link,
            Unlink,
            Rmdir,
            Rename,
            ReadDir,
            StatFs,
            Open,
            Commit,
            Release,
            TailCut,
            ReleaseMany,
            GetXattr,
            SetXattr,
            ListXattr,
            RemoveXattr,
            Append,
            Accessed,
            SetLock,
            GetLock,
            ReleaseLocks,
            Resume,
            MyCaps,
            Regrant,
            LookupParent,
            OpenAt,
            GetFlags,
            SetFlags,
            Settle
        )
        .map_err(|e| e.code)
    }

    /// Root's 0755 directory `name` in `parent`.
    async fn mkdir(&self, parent: InodeId, name: &str) -> InodeId {
        self.0.mkdir(&Caller::ROOT, parent, name, 0o755).await
    }

    async fn names(&self, dir: InodeId) -> Vec<String> {
        let req = fs::ReadDir {
            ino: dir,
            after: None,
            max_entries: 100,
            plus: false,
        };
        let page = self.call(&Caller::ROOT, req).await.expect("readdir");
        let names = page.entries.iter();
        names
            .map(|e| String::from_utf8_lossy(&e.name).into())
            .collect()
    }
}

fn caps(path: &str, read_only: bool) -> Caps {
    Caps {
        path: path.as_bytes().to_vec(),
        read_only,
        ..Caps::default()
    }
}

/// `/teamA` (file `a`, directory `sub`) and `/teamB` (file `b`, directory `deep`).
struct Tree {
    team_a: InodeId,
    a: InodeId,
    team_b: InodeId,
    b: InodeId,
    deep: InodeId,
}

async fn tree(admin: &Wire) -> Tree {
    let team_a = admin.mkdir(InodeId::ROOT, "teamA").await;
    let a = admin.create(&Caller::ROOT, team_a, "a", 0o644).await.ino;
    admin.mkdir(team_a, "sub").await;
    let team_b = admin.mkdir(InodeId::ROOT, "teamB").await;
    let b = admin.create(&Caller::ROOT, team_b, "b", 0o644).await.ino;
    let deep = admin.mkdir(team_b, "deep").await;
    Tree {
        team_a,
        a,
        team_b,
        b,
        deep,
    }
}

/// Guards against a scoped client reaching outside its directory: by the root, by
/// `..`, or by a crafted request naming another inode (issue 23).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scoped_client_sees_its_directory_as_root_and_nothing_outside() {
    let cluster = InProcessCluster::start(1).await;
    let admin = Wire::admin(&cluster).await;
    let t = tree(&admin).await;
    let team_a = Caps {
        root_squash: false,
        ..caps("/teamA", false)
    };
    let scoped = Wire::with_key(&cluster, &admin, "team-a", team_a).await;
    let root = Caller::ROOT;

    // Its root is /teamA, `..` at the root is no name, and what it lists is teamA's.
    let top = scoped
        .call(&root, fs::GetAttr { ino: InodeId::ROOT })
        .await
        .unwrap();
    assert_eq!(top.ino, t.team_a, "inode 1 is the scope's root");
    assert_eq!(scoped.names(InodeId::ROOT).await, ["a", "sub"]);
    let up = fs::Lookup {
        parent: InodeId::ROOT,
        name: b"..".to_vec(),
    };
    let e = scoped.call(&root, up).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "`..` is no name: {e}");
    // Nor does a directory's parent (file handles) lead out: the scope's root is its
    // own parent, and is answered as the root the client knows (inode 1).
    let sub = fs::Lookup {
        parent: InodeId::ROOT,
        name: b"sub".to_vec(),
    };
    let sub = scoped.call(&root, sub).await.unwrap().ino;
    for dir in [InodeId::ROOT, sub] {
        let up = fs::LookupParent { dir };
        let got = scoped.call(&root, up).await.unwrap();
        assert_eq!(got.ino, InodeId::ROOT, "the parent of {dir}");
    }
    let a = fs::Lookup {
        parent: InodeId::ROOT,
        name: b"a".to_vec(),
    };
    assert_eq!(scoped.call(&root, a).await.unwrap().ino, t.a);

    // Every request kind naming an inode outside (a directory, a file, the real root
    // by its number through a child's parent chain) is refused with ENOENT.
    let mut sent = 0;
    for (dir, file) in [(t.team_b, t.b), (t.deep, t.b), (t.team_b, t.a)] {
        for mut req in one_of_each(dir, file, scoped.client) {
            // With the file inside, only the requests that name the directory too.
            let file_inside = file == t.a;
            if req.inodes_mut().is_empty() || (file_inside && !names_dir(&req)) {
                continue;
            }
            let what = req.name();
            sent += 1;
            let got = scoped.any(&root, req).await;
            assert_eq!(got, Err(ErrorCode::NotFound), "{what} naming {dir}/{file}");
        }
    }
    let counted = cluster.meta().scope_refusals();
    assert_eq!(counted, sent, "each refusal is the gate's, and counted");
    // Renames and links across the scope's edge, both ways.
    let out_of = fs::Rename {
        parent: InodeId::ROOT,
        name: b"a".to_vec(),
        new_parent: t.team_b,
        new_name: b"stolen".to_vec(),
        mode: proto::meta::RenameMode::Replace,
    };
    assert_eq!(
        scoped.call(&root, out_of).await.unwrap_err().code,
        ErrorCode::NotFound
    );
    let into = fs::Link {
        ino: t.b,
        new_parent: InodeId::ROOT,
        new_name: b"b".to_vec(),
        kernel_checked: false,
    };
    assert_eq!(
        scoped.call(&root, into).await.unwrap_err().code,
        ErrorCode::NotFound
    );
    assert_eq!(
        admin.names(t.team_b).await,
        ["b", "deep"],
        "nothing moved out or in"
    );

    // Inside, it works: a file made there is its to open again.
    let made = scoped.create(&root, InodeId::ROOT, "new", 0o644).await;
    let open = fs::Open {
        ino: made.ino,
        client: scoped.client,
        truncate: false,
        access: OpenAccess::Read,
        append: false,
    };
    assert!(scoped.call(&root, open).await.is_ok());
    // A file found by an open by name is its to name by number next (the gate noted
    // it, as it notes a lookup's).
    let fresh = admin.create(&root, t.team_a, "fresh", 0o644).await.ino;
    let open_at = fs::OpenAt {
        parent: InodeId::ROOT,
        name: b"fresh".to_vec(),
        client: scoped.client,
        access: OpenAccess::Read,
        append: false,
        accessed: Some(false),
    };
    let opened = scoped
        .call(&root, open_at)
        .await
        .expect("open /teamA/fresh by name");
    assert!(matches!(&opened, fs::OpenedAt::Opened(o) if o.attr.ino == fresh));
    let again = scoped.call(&root, fs::GetAttr { ino: fresh }).await;
    assert_eq!(again.map(|a| a.ino).ok(), Some(fresh));

    // The administrator renames /teamA: the scope follows the directory, not the name,
    // so it neither widens to / nor breaks.
    let rename = fs::Rename {
        parent: InodeId::ROOT,
        name: b"teamA".to_vec(),
        new_parent: InodeId::ROOT,
        new_name: b"renamed".to_vec(),
        mode: proto::meta::RenameMode::Replace,
    };
    admin.call(&root, rename).await.expect("rename /teamA");
    let top = scoped
        .call(&root, fs::GetAttr { ino: InodeId::ROOT })
        .await
        .unwrap();
    assert_eq!(
        top.ino, t.team_a,
        "the scope is still the renamed directory"
    );
    assert_eq!(
        scoped.names(InodeId::ROOT).await,
        ["a", "fresh", "new", "sub"]
    );
    let e = scoped
        .call(&root, fs::GetAttr { ino: t.team_b })
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "still nothing outside: {e}");
}

/// Whether `req` names a directory first (for the case whose file is inside).
fn names_dir(req: &FsRequest) -> bool {
    matches!(
        req,
        FsRequest::Lookup(_)
            | FsRequest::LookupParent(_)
            | FsRequest::OpenAt(_)
            | FsRequest::Create(_)
            | FsRequest::TmpFile(_)
            | FsRequest::MkNod(_)
            | FsRequest::Mkdir(_)
            | FsRequest::Symlink(_)
            | FsRequest::Unlink(_)
            | FsRequest::Rmdir(_)
            | FsRequest::Rename(_)
            | FsRequest::ReadDir(_)
            | FsRequest::Link(_)
    )
}

/// Guards against a read-only key changing anything: every request kind that changes
/// the file system is refused with EROFS, and reads still work (issue 23).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_client_gets_erofs_for_every_change() {
    let cluster = InProcessCluster::start(1).await;
    let admin = Wire::admin(&cluster).await;
    let t = tree(&admin).await;
    let reader = Wire::with_key(&cluster, &admin, "reader", caps("/", true)).await;
    let root = Caller::ROOT;
    let mut changes = 0;
    for req in one_of_each(t.team_a, t.a, reader.client) {
        let (what, change) = (req.name(), req.changes());
        let got = reader.any(&root, req).await;
        if change {
            changes += 1;
            assert_eq!(got, Err(ErrorCode::ReadOnly), "{what}");
        } else {
            assert_ne!(got, Err(ErrorCode::ReadOnly), "{what} changes nothing");
        }
    }
    // A tail cut is no change: it takes away only bytes past the committed length.
    assert_eq!(changes, 19, "every changing kind was sent");
    assert_eq!(
        admin.names(t.team_a).await,
        ["a", "sub"],
        "nothing was made or removed"
    );
    let open = fs::Open {
        ino: t.a,
        client: reader.client,
        truncate: false,
        access: OpenAccess::Read,
        append: false,
    };
    assert!(
        reader.call(&root, open).await.is_ok(),
        "an open for reading"
    );
    let open_at = fs::OpenAt {
        parent: t.team_a,
        name: b"a".to_vec(),
        client: reader.client,
        access: OpenAccess::Read,
        append: false,
        accessed: None,
    };
    let got = reader
        .call(&root, open_at)
        .await
        .expect("an open by name for reading");
    assert!(matches!(got, fs::OpenedAt::Opened(o) if o.attr.ino == t.a));
}

/// Guards against a client's root acting as the cluster's root (issue 23): files it
/// makes belong to nobody, and a root-only file stays closed to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn root_squash_maps_uid_gid_and_group_zero_to_nobody() {
    let cluster = InProcessCluster::start(1).await;
    let admin = Wire::admin(&cluster).await;
    let t = tree(&admin).await;
    let secret = admin
        .create(&Caller::ROOT, t.team_a, "secret", 0o600)
        .await
        .ino;
    let group = admin
        .create(&Caller::ROOT, t.team_a, "group", 0o640)
        .await
        .ino;
    let open_dir = fs::SetAttr {
        ino: t.team_a,
        set: proto::SetAttr {
            perm: Some(0o777),
            ..Default::default()
        },
        commit: None,
    };
    admin
        .call(&Caller::ROOT, open_dir)
        .await
        .expect("chmod 777");
    let squashed = Wire::with_key(&cluster, &admin, "squashed", caps("/", false)).await;

    let made = squashed
        .create(&Caller::ROOT, t.team_a, "mine", 0o644)
        .await;
    assert_eq!(
        (made.uid, made.gid),
        (NOBODY_ID, NOBODY_ID),
        "root's file is nobody's"
    );
    // Each key opens under its own client id (another key's is refused).
    let read_as = |client, ino| fs::Open {
        ino,
        client,
        truncate: false,
        access: OpenAccess::Read,
        append: false,
    };
    let read = |ino| read_as(squashed.client, ino);
    let e = squashed
        .call(&Caller::ROOT, read(secret))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::PermissionDenied, "root's 0600 file: {e}");
    let in_group_zero = Caller::with_groups(1000, 1000, [0]);
    let e = squashed
        .call(&in_group_zero, read(group))
        .await
        .unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::PermissionDenied,
        "group 0 is dropped: {e}"
    );
    // The same calls through the administrator's key (no squash) succeed.
    let by_admin = |ino| read_as(admin.client, ino);
    assert!(admin.call(&Caller::ROOT, by_admin(secret)).await.is_ok());
    assert!(admin.call(&in_group_zero, by_admin(group)).await.is_ok());
}

/// Guards against a client without the admin capability running administration calls
/// (status, fsck, key management, the data servers' file lists).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_without_the_admin_capability_gets_eperm_for_admin_calls() {
    let cluster = InProcessCluster::start(1).await;
    let admin = Wire::admin(&cluster).await;
    let plain = Wire::with_key(&cluster, &admin, "plain", caps("/", false)).await;
    let who = Caller::ROOT;
    let list = ListFiles {
        after: InodeId(0),
        limit: 10,
    };
    let refused = [
        plain.call(&who, Status).await.map(drop),
        plain.call(&who, CheckNamespace).await.map(drop),
        plain.call(&who, KeyList).await.map(drop),
        plain.call(&who, list.clone()).await.map(drop),
    ];
    for r in refused {
        let e = r.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotPermitted, "{e}");
        assert!(e.message.contains("not permitted to this key"), "{e}");
    }
    assert!(admin.call(&who, Status).await.is_ok());
    assert!(admin.call(&who, list).await.is_ok());
}

/// Guards against a key made again under a name inheriting the previous key's scope or
/// client ids (kept by name, they were: the new key saw the old path until a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_made_again_under_a_name_gets_its_own_scope_and_client_ids() {
    let cluster = InProcessCluster::start(1).await;
    let admin = Wire::admin(&cluster).await;
    let t = tree(&admin).await;
    let old = Wire::with_key(&cluster, &admin, "contractor", caps("/teamA", false)).await;
    assert_eq!(old.names(InodeId::ROOT).await, ["a", "sub"]);
    let new = Wire::with_key(&cluster, &admin, "contractor", caps("/teamB", false)).await;
    assert_eq!(new.names(InodeId::ROOT).await, ["b", "deep"]);
    let inside_a = fs::GetAttr { ino: t.a };
    let e = new.call(&Caller::ROOT, inside_a).await.unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::NotFound,
        "the new key reached /teamA: {e}"
    );
    let theirs = fs::ReleaseLocks {
        ino: t.b,
        client: old.client,
        owner: 1,
    };
    let e = new.call(&Caller::ROOT, theirs).await.unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::NotPermitted,
        "the previous key's client id: {e}"
    );
}
