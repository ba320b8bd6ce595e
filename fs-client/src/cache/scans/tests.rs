use super::*;
use proto::FileKind;

fn name(i: usize) -> Vec<u8> {
    format!("p0.{i:06}").into_bytes()
}

fn entry(n: Vec<u8>, ino: u64) -> DirEntry {
    DirEntry {
        name: n,
        ino: InodeId(ino),
        kind: FileKind::Regular,
        attr: Some(crate::fuse::dot_attr(InodeId(ino), FileKind::Regular)),
    }
}

/// What the server would answer: the names `from..to` (inode = 100 + index), `done`
/// when nothing follows.
fn page(from: usize, to: usize, done: bool) -> fs::DirPage {
    fs::DirPage {
        entries: (from..to).map(|i| entry(name(i), 100 + i as u64)).collect(),
        done,
        complete_at: None,
    }
}

const DIR: InodeId = InodeId(7);

fn fetch_of(plan: Plan) -> Fetch {
    match plan {
        Plan::Fetch(f) => f,
        other => panic!("expected a fetch, got {other:?}"),
    }
}

fn hit_ino(plan: Plan) -> Option<u64> {
    match plan {
        Plan::Hit(h) => Some(h.attr.ino.0),
        _ => None,
    }
}

#[test]
fn a_walk_in_name_order_is_answered_a_page_at_a_time() {
    let s = Scans::new(Duration::from_secs(60));
    assert_eq!(
        s.plan(DIR, &name(0)),
        Plan::Lookup,
        "nothing known: a lookup"
    );
    s.found(DIR, &name(0));
    let f = fetch_of(s.plan(DIR, &name(1)));
    assert_eq!(f.window, FIRST_WINDOW);
    assert!(f.after.as_slice() < name(1).as_slice() && f.after >= name(0));
    let n = FIRST_WINDOW as usize;
    let got = s.fetched(DIR, &name(1), f, page(1, 1 + n, false), Instant::now());
    assert!(matches!(got, Found::Attr(a) if a.ino == InodeId(101)));
    for i in 2..=n {
        assert_eq!(
            hit_ino(s.plan(DIR, &name(i))),
            Some(100 + i as u64),
            "name {i}"
        );
    }
    // The page's last entry was looked up: the next name asks for the next page,
    // twice as long, after that entry.
    let f = fetch_of(s.plan(DIR, &name(n + 1)));
    assert_eq!((f.after.clone(), f.window), (name(n), 2 * FIRST_WINDOW));
    let got = s.fetched(
        DIR,
        &name(n + 1),
        f,
        page(n + 1, 3 * n + 1, false),
        Instant::now(),
    );
    assert!(matches!(got, Found::Attr(_)));
    assert_eq!(hit_ino(s.plan(DIR, &name(3 * n))), Some(100 + 3 * n as u64));
    // Up to the largest window.
    let mut window = 2 * FIRST_WINDOW;
    let mut at = 3 * n + 1;
    for _ in 0..8 {
        let f = fetch_of(s.plan(DIR, &name(at)));
        assert_eq!(f.window, (window * 2).min(MAX_WINDOW));
        window = f.window;
        let end = at + window as usize;
        s.fetched(DIR, &name(at), f, page(at, end, false), Instant::now());
        assert_eq!(hit_ino(s.plan(DIR, &name(end - 1))), Some(99 + end as u64));
        at = end;
    }
    assert_eq!(window, MAX_WINDOW);
}

#[test]
fn two_walks_through_one_directory_keep_a_page_each() {
    let s = Scans::new(Duration::from_secs(60));
    let other = |i: usize| format!("p1.{i:06}").into_bytes();
    let other_page = |from: usize, to: usize| fs::DirPage {
        entries: (from..to)
            .map(|i| entry(other(i), 500 + i as u64))
            .collect(),
        done: false,
        complete_at: None,
    };
    s.found(DIR, &name(0));
    let f = fetch_of(s.plan(DIR, &other(0)));
    s.fetched(DIR, &other(0), f, other_page(0, 8), Instant::now());
    // The first walk's next name comes after its seed: a page of its own.
    let f = fetch_of(s.plan(DIR, &name(1)));
    s.fetched(DIR, &name(1), f, page(1, 9, false), Instant::now());
    for i in 1..8 {
        assert_eq!(hit_ino(s.plan(DIR, &other(i))), Some(500 + i as u64));
        assert_eq!(hit_ino(s.plan(DIR, &name(i + 1))), Some(101 + i as u64));
    }
    // Each continues from its own page.
    let f = fetch_of(s.plan(DIR, &other(8)));
    assert_eq!(f.after, other(7));
    let f = fetch_of(s.plan(DIR, &name(9)));
    assert_eq!(f.after, name(8));
}

#[test]
fn lookups_out_of_order_ask_the_server() {
    let s = Scans::new(Duration::from_secs(60));
    for i in [50, 40, 30, 20, 10] {
        assert_eq!(s.plan(DIR, &name(i)), Plan::Lookup);
        s.found(DIR, &name(i));
    }
    // A page whose end was not reached is not followed by another.
    let f = fetch_of(s.plan(DIR, &name(11)));
    s.fetched(DIR, &name(11), f, page(11, 27, false), Instant::now());
    assert_eq!(hit_ino(s.plan(DIR, &name(12))), Some(112));
    assert!(
        !matches!(s.plan(DIR, &name(90)), Plan::Fetch(Fetch { ref after, .. }) if *after == name(26))
    );
}

#[test]
fn a_name_missing_from_a_fresh_page_is_absent_and_stops_the_walk() {
    let s = Scans::new(Duration::from_secs(60));
    s.found(DIR, &name(0));
    // Files made one by one in name order: each lookup before a create misses.
    let f = fetch_of(s.plan(DIR, &name(5)));
    let got = s.fetched(DIR, &name(5), f, page(6, 8, false), Instant::now());
    assert_eq!(got, Found::Absent);
    assert_eq!(s.plan(DIR, &name(9)), Plan::Lookup, "no seed after a miss");
    // A kept page never says a name is missing (it may have been made since).
    assert_eq!(s.plan(DIR, &name(5)), Plan::Lookup);
    // A page that ends before the name does not tell.
    s.found(DIR, &name(20));
    let f = fetch_of(s.plan(DIR, &name(30)));
    let got = s.fetched(DIR, &name(30), f, page(21, 25, false), Instant::now());
    assert_eq!(got, Found::Unknown);
}

#[test]
fn this_clients_changes_go_first() {
    let s = Scans::new(Duration::from_secs(60));
    let walk = |s: &Scans| {
        s.found(DIR, &name(0));
        let f = fetch_of(s.plan(DIR, &name(1)));
        s.fetched(DIR, &name(1), f, page(1, 9, false), Instant::now());
    };
    walk(&s);
    // A change of one inode's attributes: that entry asks again, the others answer.
    s.before(&FsRequest::SetAttr(fs::SetAttr {
        ino: InodeId(103),
        set: Default::default(),
        commit: None,
    }));
    assert_eq!(s.plan(DIR, &name(3)), Plan::Lookup);
    assert_eq!(hit_ino(s.plan(DIR, &name(4))), Some(104));
    // Reads change nothing.
    s.before(&FsRequest::GetAttr(fs::GetAttr { ino: InodeId(105) }));
    assert_eq!(hit_ino(s.plan(DIR, &name(5))), Some(105));
    // A new name changes its directory only (which a page of its parent may hold).
    s.before(&FsRequest::Create(fs::Create {
        parent: DIR,
        name: b"new".to_vec(),
        perm: 0o644,
        exclusive: true,
        access: proto::meta::OpenAccess::Write,
        append: false,
        client: proto::ClientId(1),
    }));
    assert_eq!(hit_ino(s.plan(DIR, &name(5))), Some(105));
    // A name removed that a page holds: that entry goes (and its inode counts as
    // changed, for its other names), the rest answer.
    s.before(&FsRequest::Unlink(fs::Unlink {
        parent: DIR,
        name: name(6),
    }));
    assert_eq!(s.plan(DIR, &name(6)), Plan::Lookup);
    assert_eq!(hit_ino(s.plan(DIR, &name(7))), Some(107));
    // A link changes the inode linked.
    s.before(&FsRequest::Link(fs::Link {
        ino: InodeId(108),
        new_parent: DIR,
        new_name: b"again".to_vec(),
        kernel_checked: false,
    }));
    assert_eq!(s.plan(DIR, &name(8)), Plan::Lookup);
    assert_eq!(hit_ino(s.plan(DIR, &name(2))), Some(102));
    // One no page holds (its inode is unknown): every page goes.
    s.before(&FsRequest::Unlink(fs::Unlink {
        parent: DIR,
        name: name(70),
    }));
    assert_eq!(hit_ino(s.plan(DIR, &name(2))), None);
    // A page asked for before such a change and answered after it is not kept.
    s.found(DIR, &name(10));
    let f = fetch_of(s.plan(DIR, &name(11)));
    s.before(&FsRequest::Rename(fs::Rename {
        parent: DIR,
        name: name(1),
        new_parent: DIR,
        new_name: name(2),
        mode: proto::meta::RenameMode::Replace,
    }));
    let got = s.fetched(DIR, &name(11), f, page(11, 20, false), Instant::now());
    assert_eq!(got, Found::Unknown);
    assert_eq!(
        hit_ino(s.plan(DIR, &name(12))),
        None,
        "the page was not kept"
    );
    // One whose entry's inode changed meanwhile: that entry asks again.
    s.found(DIR, &name(30));
    let f = fetch_of(s.plan(DIR, &name(31)));
    s.before(&FsRequest::Accessed(fs::Accessed {
        ino: InodeId(132),
        strict: false,
    }));
    let got = s.fetched(DIR, &name(31), f, page(31, 40, false), Instant::now());
    assert!(matches!(got, Found::Attr(_)));
    assert_eq!(s.plan(DIR, &name(32)), Plan::Lookup);
    assert_eq!(hit_ino(s.plan(DIR, &name(33))), Some(133));
}

#[test]
fn pages_expire_with_the_ttl_and_say_how_old_they_are() {
    let s = Scans::new(Duration::from_millis(50));
    s.found(DIR, &name(0));
    let f = fetch_of(s.plan(DIR, &name(1)));
    let asked = Instant::now();
    s.fetched(DIR, &name(1), f, page(1, 9, false), asked);
    std::thread::sleep(Duration::from_millis(10));
    match s.plan(DIR, &name(2)) {
        Plan::Hit(h) => {
            assert!(h.age >= Duration::from_millis(10) && h.age < Duration::from_millis(50))
        }
        other => panic!("expected a hit, got {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(hit_ino(s.plan(DIR, &name(3))).is_none(), "expired");
    let off = Scans::new(Duration::ZERO);
    off.found(DIR, &name(0));
    assert_eq!(
        off.plan(DIR, &name(1)),
        Plan::Lookup,
        "a zero TTL asks for no page"
    );
}

#[test]
fn the_cursor_before_a_name_lists_from_it() {
    assert_eq!(cursor_before(b"ab"), Some(b"aa".to_vec()));
    assert_eq!(cursor_before(b"a"), Some(b"`".to_vec()));
    assert_eq!(cursor_before(b"a\0"), None);
    assert_eq!(cursor_before(b""), None);
    assert!(cursor_before(b"p0.000123").unwrap().as_slice() < b"p0.000123".as_slice());
}

#[test]
fn a_directory_that_refused_a_page_is_looked_up_name_by_name() {
    let s = Scans::new(Duration::from_secs(60));
    s.found(DIR, &name(0));
    assert!(matches!(s.plan(DIR, &name(1)), Plan::Fetch(_)));
    s.refused(DIR);
    s.found(DIR, &name(1));
    assert_eq!(s.plan(DIR, &name(2)), Plan::Lookup);
}

#[test]
fn lookups_in_no_order_soon_stop_asking_for_pages() {
    let s = Scans::new(Duration::from_secs(60));
    let (mut fetches, mut x) = (0, 12345u64);
    for _ in 0..1000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = (x >> 33) as usize % 10_000;
        match s.plan(DIR, &name(i)) {
            Plan::Fetch(f) => {
                fetches += 1;
                s.fetched(DIR, &name(i), f, page(i, i + 16, false), Instant::now());
            }
            Plan::Lookup => s.found(DIR, &name(i)),
            Plan::Hit(_) => {}
        }
    }
    // Half of them come after the name before: without the back-off, about 500.
    assert!(
        fetches < 100,
        "{fetches} pages for 1,000 lookups in no order"
    );
    // A walk after them starts again, after at most MAX_SKIP plain lookups.
    let mut asked = 0;
    let mut i = 20_000;
    while !matches!(s.plan(DIR, &name(i)), Plan::Fetch(_)) {
        s.found(DIR, &name(i));
        i += 1;
        asked += 1;
        assert!(
            asked <= MAX_SKIP + 1,
            "no page after {asked} lookups in order"
        );
    }
}
