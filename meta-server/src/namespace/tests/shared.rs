//! Two metadata servers writing one namespace on one etcd prefix at the same time (issue
//! 24): each change a checked transaction, run again when the other server's change got
//! there first.
//!
//! Two namespaces, each on its own etcd client, make seeded random creates, mkdirs,
//! symlinks, renames, unlinks and rmdirs of the same few names in the same directories
//! from two threads at once. etcd orders every commit by its revision, so the changes
//! that succeeded, replayed on a plain model in that order, must each succeed there too
//! (the history is one serial order), and the model at the end must be the namespace
//! each server lists. A change that failed must have failed for a reason of the
//! namespace (a name missing or taken), never for the race itself. A server keeps some
//! of the files it creates open across its next changes: each must still be there when
//! it closes it, whatever the other server did to its name.

use super::model::Rng;
use super::{walk, ROOT};
use crate::clock::SystemClock;
use crate::config::NamespaceConfig;
use crate::kv::etcd::local::LocalEtcd;
use crate::kv::etcd::test_hooks::take_first_commit;
use crate::kv::{open_engine, EtcdConfig, KvStore, StoreKind};
use crate::namespace::{ConnId, Handle, Namespace};
use proto::meta::{fs, OpenAccess, RenameMode};
use proto::{ClientId, ErrorCode, FileKind, InodeId, SessionId};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Changes per server; both run at once.
const OPS_PER_SERVER: usize = 1500;
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
/// The directories the changes happen in: the root, and two made first.
const DIRS: [&str; 3] = ["", "d1", "d2"];

#[derive(Clone, Debug)]
enum Op {
    Create(usize, &'static str),
    Mkdir(usize, &'static str),
    Symlink(usize, &'static str),
    Unlink(usize, &'static str),
    Rmdir(usize, &'static str),
    Rename((usize, &'static str), (usize, &'static str)),
}

/// What one change did: which server, its outcome (the new inode of a make), and where
/// etcd put its commit.
#[derive(Debug)]
struct Done {
    server: usize,
    op: Op,
    outcome: Result<Option<InodeId>, ErrorCode>,
    revision: Option<i64>,
}

fn random_op(rng: &mut Rng) -> Op {
    let which = rng.below(6);
    let mut at = || (rng.below(DIRS.len() as u64) as usize, rng.pick(&NAMES));
    let (d, n) = at();
    match which {
        0 => Op::Create(d, n),
        1 => Op::Mkdir(d, n),
        2 => Op::Symlink(d, n),
        3 => Op::Unlink(d, n),
        4 => Op::Rmdir(d, n),
        _ => loop {
            let to = at();
            if to != (d, n) {
                return Op::Rename((d, n), to);
            }
        },
    }
}

/// Files a server keeps open across later changes (the other server may unlink them
/// meanwhile), at most.
const HELD_OPEN: usize = 2;

/// Runs `op` on `ns`; `dirs` are the inodes of [`DIRS`]. A file created is closed at
/// once, or kept open in `held` while it holds fewer than [`HELD_OPEN`].
fn run(
    ns: &Namespace,
    dirs: &[InodeId],
    op: &Op,
    held: &mut VecDeque<(InodeId, SessionId)>,
) -> Result<Option<InodeId>, ErrorCode> {
    match op {
        Op::Create(d, n) => {
            let create = fs::Create {
                parent: dirs[*d],
                name: n.as_bytes().to_vec(),
                perm: 0o644,
                exclusive: true,
                access: OpenAccess::ReadWrite,
                append: false,
                client: ClientId(1),
            };
            let opened = ask(ns, create)?;
            if held.len() < HELD_OPEN {
                held.push_back((opened.attr.ino, opened.session));
            } else {
                ns.retry_conflicts("release", || ns.release(opened.session, None))
                    .expect("release");
            }
            Ok(Some(opened.attr.ino))
        }
        Op::Mkdir(d, n) => ask(
            ns,
            fs::Mkdir {
                parent: dirs[*d],
                name: n.as_bytes().to_vec(),
                perm: 0o755,
            },
        )
        .map(|m| Some(m.attr.ino)),
        Op::Symlink(d, n) => ask(
            ns,
            fs::Symlink {
                parent: dirs[*d],
                name: n.as_bytes().to_vec(),
                target: b"t".to_vec(),
            },
        )
        .map(|m| Some(m.attr.ino)),
        Op::Unlink(d, n) => ask(
            ns,
            fs::Unlink {
                parent: dirs[*d],
                name: n.as_bytes().to_vec(),
            },
        )
        .map(|_| None),
        Op::Rmdir(d, n) => ask(
            ns,
            fs::Rmdir {
                parent: dirs[*d],
                name: n.as_bytes().to_vec(),
            },
        )
        .map(|_| None),
        Op::Rename((d, n), (d2, n2)) => ask(
            ns,
            fs::Rename {
                parent: dirs[*d],
                name: n.as_bytes().to_vec(),
                new_parent: dirs[*d2],
                new_name: n2.as_bytes().to_vec(),
                mode: RenameMode::Replace,
            },
        )
        .map(|_| None),
    }
}

/// `req` through `ns`'s request path (checked, run again on conflicts), as a client's
/// request on one connection; a failure as its code.
fn ask<R: Handle>(ns: &Namespace, req: R) -> Result<R::Reply, ErrorCode> {
    ns.handle(req, ConnId(1)).map_err(|e| e.code)
}

/// Closes the file `ns` has held open longest, which must still be there (unlinked by
/// the other server meanwhile or not).
fn close_oldest(ns: &Namespace, held: &mut VecDeque<(InodeId, SessionId)>) {
    if let Some((ino, session)) = held.pop_front() {
        if let Err(e) = ns.getattr(ino) {
            panic!("{ino}, open in {session}, is gone: {e}");
        }
        ns.retry_conflicts("release", || ns.release(session, None))
            .expect("release");
    }
}

/// The model: each (directory, name) that exists, with its kind and inode. Names made
/// by the changes are never directories with anything in them.
type Model = BTreeMap<(usize, &'static str), (FileKind, InodeId)>;

/// Applies a change that succeeded on the servers; an error says why the model, in
/// this order, would have refused it.
fn apply(model: &mut Model, d: &Done) -> Result<(), String> {
    let made = |model: &mut Model, at: (usize, &'static str), kind| {
        let ino = d.outcome.ok().flatten().ok_or("no inode")?;
        match model.insert(at, (kind, ino)) {
            Some(was) => Err(format!("{at:?} existed already ({was:?})")),
            None => Ok(()),
        }
    };
    match &d.op {
        Op::Create(di, n) => made(model, (*di, n), FileKind::Regular),
        Op::Mkdir(di, n) => made(model, (*di, n), FileKind::Directory),
        Op::Symlink(di, n) => made(model, (*di, n), FileKind::Symlink),
        Op::Unlink(di, n) => match model.remove(&(*di, n)) {
            Some((k, _)) if k != FileKind::Directory => Ok(()),
            was => Err(format!("unlink of {:?}: {was:?}", (di, n))),
        },
        Op::Rmdir(di, n) => match model.remove(&(*di, n)) {
            Some((FileKind::Directory, _)) => Ok(()),
            was => Err(format!("rmdir of {:?}: {was:?}", (di, n))),
        },
        Op::Rename(from, to) => {
            let (kind, ino) = model
                .remove(from)
                .ok_or_else(|| format!("rename of {from:?}: missing"))?;
            match model.get(to) {
                Some((k, _)) if (*k == FileKind::Directory) != (kind == FileKind::Directory) => {
                    return Err(format!("rename of {kind:?} {from:?} over {k:?} {to:?}"));
                }
                _ => {}
            }
            model.insert(*to, (kind, ino));
            Ok(())
        }
    }
}

#[test]
fn two_servers_on_one_etcd_prefix_keep_one_serial_order() {
    if !LocalEtcd::present_for_tests() {
        return;
    }
    let etcd = LocalEtcd::shared().expect("starting etcd");
    let config: EtcdConfig = etcd.config();
    let dir = tempfile::tempdir().unwrap();
    let engine = || open_engine(StoreKind::Etcd, dir.path(), &config).unwrap();

    // Data servers and the two directories, made by one server alone first.
    let dirs: Vec<InodeId> = {
        let store: Arc<dyn KvStore> = engine();
        let ns = Namespace::open(store, NamespaceConfig::default()).unwrap();
        for i in 0..3 {
            ns.register_data(None, &format!("10.0.0.{i}:7000"), 1000, 10)
                .unwrap();
        }
        let mut dirs = vec![ROOT];
        for name in &DIRS[1..] {
            dirs.push(super::mkdir(&ns, ROOT, name).ino);
        }
        ns.sync().unwrap();
        dirs
    };
    let servers: Vec<Namespace> = (0..2)
        .map(|_| {
            Namespace::open_shared(engine(), NamespaceConfig::default(), Arc::new(SystemClock))
                .unwrap()
        })
        .collect();

    let seed = std::env::var("TESSERA_SHARED_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0024_u64);
    eprintln!("seed {seed} (rerun with TESSERA_SHARED_SEED={seed})");
    let mut done: Vec<Done> = std::thread::scope(|s| {
        let runs: Vec<_> = servers
            .iter()
            .enumerate()
            .map(|(server, ns)| {
                let dirs = &dirs;
                s.spawn(move || {
                    let mut rng = Rng(seed ^ (server as u64 + 1).wrapping_mul(0x9e37_79b9));
                    let mut held = VecDeque::new();
                    let done = (0..OPS_PER_SERVER)
                        .map(|i| {
                            let op = random_op(&mut rng);
                            take_first_commit();
                            let outcome = run(ns, dirs, &op, &mut held);
                            let revision = take_first_commit();
                            // A file kept open a few changes: whatever the other server
                            // did to its name meanwhile, it is there until its close.
                            if i % 3 == 0 {
                                close_oldest(ns, &mut held);
                            }
                            Done {
                                server,
                                op,
                                outcome,
                                revision,
                            }
                        })
                        .collect::<Vec<_>>();
                    while !held.is_empty() {
                        close_oldest(ns, &mut held);
                    }
                    done
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });

    // Failures are the namespace's answers, never the race's; nothing failed landed.
    for d in &done {
        match &d.outcome {
            Ok(_) => assert!(d.revision.is_some(), "{d:?} succeeded without a commit"),
            Err(code) => {
                assert!(
                    matches!(
                        code,
                        ErrorCode::NotFound
                            | ErrorCode::AlreadyExists
                            | ErrorCode::IsADirectory
                            | ErrorCode::NotADirectory
                            | ErrorCode::NotEmpty
                    ),
                    "{d:?}"
                );
                assert!(d.revision.is_none(), "{d:?} failed after it committed");
            }
        }
    }
    let both = |server| done.iter().any(|d| d.server == server && d.outcome.is_ok());
    assert!(both(0) && both(1), "each server made changes");

    // The successes in etcd's order are one serial history.
    done.retain(|d| d.outcome.is_ok());
    done.sort_by_key(|d| d.revision);
    let mut model = Model::new();
    for (i, d) in done.iter().enumerate() {
        if let Err(why) = apply(&mut model, d) {
            panic!("change {i} of {} in commit order, {d:?}: {why}", done.len());
        }
    }

    // Each server lists the model; the namespace check finds nothing wrong.
    let mut want: BTreeMap<Vec<u8>, (FileKind, InodeId)> = BTreeMap::new();
    for (i, name) in DIRS.iter().enumerate().skip(1) {
        want.insert(
            format!("/{name}").into_bytes(),
            (FileKind::Directory, dirs[i]),
        );
    }
    for ((d, n), v) in &model {
        let path = match DIRS[*d] {
            "" => format!("/{n}"),
            dir => format!("/{dir}/{n}"),
        };
        want.insert(path.into_bytes(), *v);
    }
    for ns in &servers {
        let seen: BTreeMap<Vec<u8>, (FileKind, InodeId)> = walk(ns)
            .into_iter()
            .map(|(p, s)| (p, (s.kind, s.ino)))
            .collect();
        assert_eq!(seen, want);
        assert_eq!(ns.check_namespace().unwrap(), Vec::<String>::new());
    }
    eprintln!(
        "{} changes succeeded of {}, {} names at the end",
        done.len(),
        2 * OPS_PER_SERVER,
        model.len()
    );
}
