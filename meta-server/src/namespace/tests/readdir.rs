//! Directory listings: paging, the stable cursor under change, limits, readdirplus.

use super::{caller, code, engine_tests, list, mkdir, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::{MAX_READDIR_ENTRIES, READDIR_BUDGET_BYTES};
use proto::meta::fs::{DirPage, ReadDir};
use proto::{ErrorCode, FileKind, InodeId};
use std::collections::BTreeSet;

fn fifo(h: &H, dir: InodeId, name: &[u8]) {
    h.ns()
        .mknod(dir, name, FileKind::Fifo, 0o644, 0, caller())
        .unwrap();
}

fn readdir_cursor_is_stable_under_churn(kind: StoreKind) {
    let h = H::new(kind);
    let ns = h.ns();
    let d = mkdir(ns, ROOT, "d");
    let name = |i: u32| format!("e{i:05}").into_bytes();
    for i in (0..4200).step_by(2) {
        fifo(&h, d.ino, &name(i));
    }
    let initial: BTreeSet<Vec<u8>> = list(ns, d.ino).into_iter().collect();
    assert_eq!(initial.len(), 2100);
    let mut removed = BTreeSet::new();
    let mut seen = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    let mut pages = 0;
    loop {
        let page = ns.readdir(d.ino, after.as_deref(), 97, false).unwrap();
        pages += 1;
        assert!(pages < 1000, "paging does not end");
        seen.extend(page.entries.iter().map(|e| e.name.clone()));
        after = page.entries.last().map(|e| e.name.clone()).or(after);
        if page.done {
            break;
        }
        // Between pages, change the directory on both sides of the cursor.
        let at = page.entries.last().map_or(0, |e| {
            std::str::from_utf8(&e.name[1..])
                .unwrap()
                .parse::<u32>()
                .unwrap()
        });
        for victim in [at.saturating_sub(40) & !1, (at + 60) & !1] {
            if ns.unlink(d.ino, &name(victim)).is_ok() {
                removed.insert(name(victim));
            }
        }
        for odd in [at.saturating_sub(31) | 1, at + 51] {
            fifo(&h, d.ino, &name(odd));
        }
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "sorted, without duplicates"
    );
    let seen: BTreeSet<_> = seen.into_iter().collect();
    for n in initial.difference(&removed) {
        assert!(
            seen.contains(n),
            "skipped unchanged {:?}",
            String::from_utf8_lossy(n)
        );
    }
    assert!(pages > 20);
}

fn readdir_plus_and_limits(kind: StoreKind) {
    let h = H::new(kind);
    let ns = h.ns();
    let d = mkdir(ns, ROOT, "d");
    assert_eq!(ns.readdir(d.ino, None, 10, true).unwrap().entries, vec![]);
    assert!(ns.readdir(d.ino, None, 10, true).unwrap().done);
    for i in 0..1500u32 {
        let mut n = vec![b'x'; 251];
        n.extend_from_slice(format!("{i:04}").as_bytes());
        fifo(&h, d.ino, &n);
    }
    mkdir(ns, d.ino, "sub");
    let page = ns.readdir(d.ino, None, u32::MAX, true).unwrap();
    assert!(!page.done);
    assert!(
        page.entries.len() < MAX_READDIR_ENTRIES as usize,
        "the byte budget cuts first"
    );
    let reply: proto::RpcResult<ReadDir> = Ok(DirPage {
        entries: page.entries.clone(),
        done: false,
        complete_at: None,
    });
    let bytes = proto::codec::encode(&reply, 128 << 10).unwrap().len();
    assert!(bytes <= READDIR_BUDGET_BYTES + 64, "{bytes} bytes");
    for e in &page.entries {
        assert_eq!(e.attr.as_ref().unwrap(), &ns.getattr(e.ino).unwrap());
        assert!(e.name != b"." && e.name != b"..");
    }
    let one = ns.readdir(d.ino, None, 0, false).unwrap();
    assert_eq!((one.entries.len(), one.done), (1, false));
    assert!(one.entries[0].attr.is_none());
    let small = ns.readdir(d.ino, Some(b"sub"), 5, false).unwrap();
    assert_eq!((small.entries.len(), small.done), (5, false));
    assert!(
        small.entries.iter().all(|e| e.name.starts_with(b"xxx")),
        "\"sub\" < \"x..\""
    );
    let all = list(ns, d.ino);
    assert_eq!(all.len(), 1501);
    let last = ns.readdir(d.ino, Some(&[0xff; 10_000]), 5, false).unwrap();
    assert!(last.done && last.entries.is_empty());
    let wire = ns.handle(
        ReadDir {
            ino: d.ino,
            after: None,
            max_entries: 5000,
            plus: false,
        },
        super::super::ConnId(1),
    );
    assert!(matches!(wire, Ok(DirPage { entries, .. }) if entries.len() <= 1024));
}

fn readdir_refuses_non_directories(kind: StoreKind) {
    let h = H::new(kind);
    fifo(&h, ROOT, b"p");
    let p = h.ns().lookup(ROOT, b"p").unwrap();
    assert_eq!(
        code(h.ns().readdir(p.ino, None, 10, false)),
        ErrorCode::NotADirectory
    );
    assert_eq!(
        code(h.ns().readdir(InodeId(77), None, 10, false)),
        ErrorCode::NotFound
    );
}

engine_tests!(
    readdir_cursor_is_stable_under_churn,
    readdir_plus_and_limits,
    readdir_refuses_non_directories,
);
