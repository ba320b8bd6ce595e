//! The library API by path (`fs_client::api`, issue 29 item 1) against a real cluster:
//! three data servers and a metadata server in this process, on 127.0.0.1. Its calls
//! block, so each test drives it from a thread of its own while the cluster runs on the
//! test's runtime; a second, plain `Client` checks that what one wrote the other reads.

use fs_client::api::{FileType, OpenOptions, Options, Tessera};
use fs_client::ClientError;
use std::sync::Arc;
use tessera_tests::{client_io, pseudo_random, sha256_hex, InProcessCluster};

/// Runs `f` with an API connection to `cluster` on a thread of its own.
async fn with_api<R: Send + 'static>(
    cluster: &InProcessCluster,
    f: impl FnOnce(Tessera) -> R + Send + 'static,
) -> R {
    cluster.with_api(f).await
}

fn errno(r: Result<impl std::fmt::Debug, ClientError>) -> i32 {
    r.expect_err("the call must fail").errno()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_written_read_and_listed_by_path() {
    let cluster = InProcessCluster::start(3).await;
    let big = pseudo_random(9 << 20, 29);
    let big2 = big.clone();
    // For a second connection of the API.
    let (meta, config) = (cluster.meta_addr(), cluster.client_config());
    with_api(&cluster, move |fs| {
        fs.create_dir_all("/data/train/shard-0", 0o755).unwrap();
        fs.create_dir_all("data/train/shard-0", 0o755)
            .expect("again: nothing to do");
        fs.write("/data/train/shard-0/big.bin", &big2).unwrap();
        let back = fs.read("/data/./train/../train/shard-0/big.bin").unwrap();
        assert!(back == big2, "the 9 MiB file read back differs");

        // Positioned reads across segment and buffer boundaries, short at the end.
        let mut buf = vec![0u8; 3 << 20];
        let at = (4 << 20) - 5;
        let n = fs
            .read_into("/data/train/shard-0/big.bin", at, &mut buf)
            .unwrap();
        assert_eq!(n, buf.len());
        assert_eq!(&buf[..], &big2[at as usize..at as usize + buf.len()]);
        let tail = (9 << 20) - 100;
        assert_eq!(
            fs.read_into("/data/train/shard-0/big.bin", tail, &mut buf)
                .unwrap(),
            100
        );
        assert_eq!(
            fs.read_into("/data/train/shard-0/big.bin", 9 << 20, &mut buf)
                .unwrap(),
            0
        );

        let m = fs.metadata("/data/train/shard-0/big.bin").unwrap();
        assert!(m.is_file());
        assert_eq!(m.size, 9 << 20);
        assert_eq!(m.mode & libc::S_IFMT, libc::S_IFREG);
        assert!(fs.metadata("/data").unwrap().is_dir());
        assert!(fs.metadata("/").unwrap().is_dir());

        // Many files, read at once, in the order asked: small ones, and some of several
        // buffers each, so that 16 at once ask for more buffers than the pool has.
        let size = |i: usize| {
            if i.is_multiple_of(20) {
                (3 << 20) + i * 4099
            } else {
                1000 + i
            }
        };
        let names: Vec<String> = (0..200).map(|i| format!("/data/small/{i:04}")).collect();
        fs.create_dir("/data/small", 0o755).unwrap();
        for (i, n) in names.iter().enumerate() {
            fs.write(n, &pseudo_random(size(i), i as u64)).unwrap();
        }
        let mut asked = names.clone();
        asked.push("/data/small/missing".into());
        let got = fs.read_many(&asked);
        for (i, r) in got[..200].iter().enumerate() {
            let want = pseudo_random(size(i), i as u64);
            assert!(r.as_ref().unwrap() == &want, "file {i} differs");
        }
        assert_eq!(got[200].as_ref().unwrap_err().errno(), libc::ENOENT);

        // The same in two steps, into buffers the caller makes between them (as
        // Python's `bytes`): each open says its file's length; a file closed before
        // its read fails alone.
        let some: Vec<String> = asked[..20].to_vec();
        let opened = fs.open_many(&some);
        let jobs: Vec<_> = opened
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let f = r.unwrap();
                assert_eq!(f.len(), size(i) as u64, "file {i}");
                if i == 7 {
                    f.close().unwrap();
                }
                (f, vec![0xa5u8; size(i)].into_boxed_slice())
            })
            .collect();
        for (i, r) in fs.read_whole_into(jobs).iter().enumerate() {
            if i == 7 {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.errno(), libc::EBADF, "{e}");
                continue;
            }
            let (buf, n) = r.as_ref().unwrap();
            assert_eq!(*n, size(i), "file {i}");
            assert!(
                buf[..] == pseudo_random(size(i), i as u64)[..],
                "file {i} differs"
            );
        }
        let missing = fs.open_many(&["/data/small/missing", "/data/small/0001"]);
        assert_eq!(missing[0].as_ref().unwrap_err().errno(), libc::ENOENT);
        assert_eq!(missing[1].as_ref().unwrap().len(), size(1) as u64);
        // A file of another connection, or one open only to write, is not read.
        let options = Options {
            config,
            ..Options::new()
        };
        let other = Tessera::connect(&[meta], options).unwrap();
        let theirs = other.open("/data/small/0002", &OpenOptions::new()).unwrap();
        let how = OpenOptions {
            read: false,
            write: true,
            ..OpenOptions::new()
        };
        let write_only = fs.open("/data/small/0003", &how).unwrap();
        let refused = fs.read_whole_into(vec![(theirs, vec![0u8; 8]), (write_only, vec![0u8; 8])]);
        for r in &refused {
            assert_eq!(r.as_ref().unwrap_err().errno(), libc::EBADF);
        }
        // In the middle of a batch, a missing name fails alone, the others in place.
        let mixed = fs.read_many(&["/data/small/0004", "/data/small/none", "/data/small/0005"]);
        assert_eq!(mixed[0].as_ref().unwrap(), &pseudo_random(size(4), 4));
        assert_eq!(mixed[1].as_ref().unwrap_err().errno(), libc::ENOENT);
        assert_eq!(mixed[2].as_ref().unwrap(), &pseudo_random(size(5), 5));

        let mut listed: Vec<String> = fs
            .read_dir_plus("/data/small")
            .unwrap()
            .into_iter()
            .map(|e| {
                assert_eq!(e.kind, FileType::File);
                let m = e.metadata.expect("read_dir_plus gives attributes");
                let i: usize = e.name.parse().unwrap();
                assert_eq!(m.size, size(i) as u64, "{}", e.name);
                e.name
            })
            .collect();
        listed.sort();
        let want: Vec<String> = (0..200).map(|i| format!("{i:04}")).collect();
        assert_eq!(listed, want);
        fs.write("/top.bin", &big2).unwrap();
    })
    .await;
    // Another client, as a mount would, reads what the API wrote.
    let other = cluster.client().await;
    let seen = client_io::read_whole(&other, "top.bin").await.unwrap();
    assert_eq!(sha256_hex(&seen), sha256_hex(&big));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_files_read_into_lent_buffers_see_this_clients_unsent_writes() {
    let cluster = InProcessCluster::start(3).await;
    with_api(&cluster, |fs| {
        // Across chunks (4 MiB) and I/O buffers, an empty file, one byte.
        let sizes = [9 << 20, 0, 1, 70_000, (4 << 20) + 1];
        let names: Vec<String> = (0..sizes.len()).map(|i| format!("/lent-{i}")).collect();
        for (i, n) in names.iter().enumerate() {
            fs.write(n, &pseudo_random(sizes[i], i as u64)).unwrap();
        }
        let jobs: Vec<_> = fs
            .open_many(&names)
            .into_iter()
            .map(|r| {
                let f = r.unwrap();
                let n = f.len() as usize;
                (f, vec![0xa5u8; n + 3])
            })
            .collect();
        for (i, r) in fs.read_whole_lent(jobs).into_iter().enumerate() {
            let (buf, n) = r.unwrap();
            assert_eq!(n, sizes[i], "file {i}");
            assert!(
                buf[..n] == pseudo_random(sizes[i], i as u64)[..],
                "file {i}"
            );
            assert_eq!(&buf[n..], &[0xa5; 3], "file {i}: past its end untouched");
        }
        // Writes this client has buffered and not sent are read too (through the I/O
        // buffers, which send them first), by `read_many` and `read_whole_lent` alike.
        let rw = OpenOptions {
            write: true,
            ..OpenOptions::new()
        };
        let w = fs.open(&names[3], &rw).unwrap();
        w.write_at(b"unsent", 100).unwrap();
        w.write_at(b"grown", 70_000).unwrap();
        let mut want = pseudo_random(sizes[3], 3);
        want[100..106].copy_from_slice(b"unsent");
        want.extend_from_slice(b"grown");
        assert!(fs.read_many(&[&names[3]])[0].as_ref().unwrap() == &want);
        let f = fs.open(&names[3], &OpenOptions::new()).unwrap();
        let len = f.len() as usize;
        let (buf, n) = fs
            .read_whole_lent(vec![(f, vec![0u8; len])])
            .remove(0)
            .unwrap();
        assert!(buf[..n] == want[..], "read after the unsent writes");
        w.close().unwrap();
        assert!(fs.read(&names[3]).unwrap() == want);

        // One read at an offset: from the middle of a chunk to past the end (short),
        // at the end (nothing), and past the largest offset a file has (refused).
        let f = fs.open(&names[0], &OpenOptions::new()).unwrap();
        let at = (5 << 20) + 3;
        let (buf, n) = f.read_lent_at(vec![0u8; 6 << 20], at).unwrap();
        assert_eq!(n, sizes[0] - at as usize);
        assert!(buf[..n] == pseudo_random(sizes[0], 0)[at as usize..]);
        assert_eq!(f.read_lent_at(vec![0u8; 16], sizes[0] as u64).unwrap().1, 0);
        let e = f.read_lent_at(vec![0u8; 16], i64::MAX as u64).unwrap_err();
        assert!(matches!(e, ClientError::TooLarge(_)), "{e}");
        f.close().unwrap();

        // A read a little past a boundary (as `torch.load` reads each storage, 64 bytes
        // into the zip's record) is cut at the I/O buffers' boundaries in the file, so no
        // window straddles a chunk: 8 MiB from offset 64 in 1 MiB windows is 9 calls
        // (windows cut from the offset would be 8, two of which also need 64 bytes
        // from the next chunk: 10).
        let f = fs.open(&names[0], &OpenOptions::new()).unwrap();
        let before = fs.client().rpc_counts();
        let (buf, n) = f.read_lent_at(vec![0u8; 8 << 20], 64).unwrap();
        let calls = fs.client().rpc_counts() - before;
        assert_eq!(n, 8 << 20);
        assert!(buf[..] == pseudo_random(sizes[0], 0)[64..n + 64]);
        assert_eq!(calls.retries, 0, "{calls:?}");
        assert!(calls.data_calls <= 9, "{calls:?}");
        let mut plain = vec![0u8; (8 << 20) + 5];
        assert_eq!(f.read_at(&mut plain, 64).unwrap(), (8 << 20) + 5);
        assert!(plain[..] == pseudo_random(sizes[0], 0)[64..(8 << 20) + 69]);
        f.close().unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_write_append_truncate_sync_and_close() {
    let cluster = InProcessCluster::start(3).await;
    with_api(&cluster, |fs| {
        let rw = OpenOptions {
            write: true,
            create: true,
            ..OpenOptions::new()
        };
        let f = fs.open("/ckpt", &rw).unwrap();
        assert_eq!(f.write_at(b"hello world", 0).unwrap(), 11);
        assert_eq!(f.write_at(b"W", 6).unwrap(), 1);
        assert_eq!(f.len(), 11);
        f.sync_all().unwrap();
        let mut buf = [0u8; 32];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 11);
        assert_eq!(&buf[..11], b"hello World");
        f.set_len(5).unwrap();
        assert_eq!(f.metadata().unwrap().size, 5);
        f.close().unwrap();
        assert_eq!(fs.read("/ckpt").unwrap(), b"hello");

        let app = OpenOptions {
            append: true,
            ..OpenOptions::new()
        };
        let a = fs.open("/ckpt", &app).unwrap();
        assert_eq!(a.append(b", more").unwrap(), 5);
        // A positioned write of an appending handle goes to the end, as on Linux.
        a.write_at(b"!", 0).unwrap();
        a.close().unwrap();
        assert_eq!(fs.read("/ckpt").unwrap(), b"hello, more!");

        let trunc = OpenOptions {
            write: true,
            truncate: true,
            ..OpenOptions::new()
        };
        fs.open("/ckpt", &trunc).unwrap().close().unwrap();
        assert_eq!(fs.metadata("/ckpt").unwrap().size, 0);

        // What the open allows: EBADF otherwise, and after close.
        let ro = fs.open("/ckpt", &OpenOptions::new()).unwrap();
        assert_eq!(errno(ro.write_at(b"x", 0)), libc::EBADF);
        assert_eq!(errno(ro.append(b"x")), libc::EBADF);
        assert_eq!(errno(ro.set_len(10)), libc::EBADF);
        ro.close().unwrap();
        assert_eq!(errno(ro.close()), libc::EBADF);
        assert_eq!(errno(ro.read_at(&mut buf, 0)), libc::EBADF);
        let wo = fs
            .open("/ckpt", OpenOptions::new().read(false).write(true))
            .unwrap();
        assert_eq!(errno(wo.read_at(&mut buf, 0)), libc::EBADF);
        // Writing nothing past the end changes nothing, as pwrite(2) of 0 bytes.
        assert_eq!(wo.write_at(b"", 1000).unwrap(), 0);
        // Growing with set_len reads as zeros; reads past the end read nothing.
        wo.set_len(3000).unwrap();
        wo.close().unwrap();
        assert_eq!(fs.read("/ckpt").unwrap(), vec![0u8; 3000]);
        let f = fs.open("/ckpt", &OpenOptions::new()).unwrap();
        assert_eq!(f.read_at(&mut buf, 5000).unwrap(), 0);
        assert_eq!(errno(f.read_at(&mut buf, u64::MAX - 3)), libc::EFBIG);
        f.close().unwrap();
        let trunc_ro = OpenOptions {
            truncate: true,
            ..OpenOptions::new()
        };
        assert_eq!(errno(fs.open("/ckpt", &trunc_ro)), libc::EINVAL);

        // O_CREAT follows a link at the last name, dangling or not.
        fs.symlink("step-1", "/latest").unwrap();
        fs.write("/latest", b"one").unwrap();
        assert_eq!(fs.read("/step-1").unwrap(), b"one");
        fs.write("/latest", b"two").unwrap();
        assert_eq!(fs.read("/step-1").unwrap(), b"two");
        let excl = OpenOptions::new().write(true).create_new(true).clone();
        assert_eq!(errno(fs.open("/latest", &excl)), libc::EEXIST);

        // A file dropped without close is closed in the background, its bytes kept.
        let f = fs
            .open("/dropped", OpenOptions::new().write(true).create(true))
            .unwrap();
        f.write_at(&pseudo_random(100_000, 7), 0).unwrap();
        drop(f);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while fs.metadata("/dropped").unwrap().size != 100_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "the dropped file's length never came"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(fs.read("/dropped").unwrap() == pseudo_random(100_000, 7));

        // Created files and directories get the mode less the umask (022 in tests).
        let m = fs.metadata("/ckpt").unwrap();
        assert_eq!(m.mode & 0o777, 0o666 & !current_umask());
    })
    .await;
}

fn current_umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("Umask:"))
        .expect("a Umask line");
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).expect("an octal umask")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_symlinks_removals_and_the_errors_os_gives() {
    let cluster = InProcessCluster::start(3).await;
    with_api(&cluster, |fs| {
        fs.create_dir("/d", 0o755).unwrap();
        fs.write("/d/new.tmp", b"new").unwrap();
        fs.write("/d/final", b"old").unwrap();
        fs.rename("/d/new.tmp", "/d/final").unwrap();
        assert_eq!(fs.read("/d/final").unwrap(), b"new");
        assert_eq!(errno(fs.metadata("/d/new.tmp")), libc::ENOENT);

        // A directory renamed by this client is found under its new name at once, and
        // a new one under the old name is not taken for it.
        fs.create_dir_all("/a/b", 0o755).unwrap();
        fs.write("/a/b/f", b"x").unwrap();
        assert_eq!(fs.read("/a/b/f").unwrap(), b"x");
        fs.rename("/a", "/z").unwrap();
        assert_eq!(fs.read("/z/b/f").unwrap(), b"x");
        assert_eq!(errno(fs.read("/a/b/f")), libc::ENOENT);
        fs.create_dir_all("/a/b", 0o755).unwrap();
        fs.write("/a/b/f", b"new").unwrap();
        assert_eq!(fs.read("/z/b/f").unwrap(), b"x");
        assert_eq!(fs.read("/a/b/f").unwrap(), b"new");

        // Symbolic links: relative and absolute targets, in the middle and at the end.
        fs.symlink("b", "/z/link").unwrap();
        fs.symlink("/z/b/f", "/abs").unwrap();
        assert_eq!(fs.read("/z/link/f").unwrap(), b"x");
        assert_eq!(fs.read("/abs").unwrap(), b"x");
        assert_eq!(fs.read_link("/abs").unwrap(), "/z/b/f");
        assert_eq!(fs.symlink_metadata("/abs").unwrap().kind, FileType::Symlink);
        assert_eq!(fs.metadata("/abs").unwrap().kind, FileType::File);
        fs.symlink("/loop2", "/loop1").unwrap();
        fs.symlink("/loop1", "/loop2").unwrap();
        assert_eq!(errno(fs.read("/loop1")), libc::ELOOP);

        let create_new = OpenOptions {
            write: true,
            create_new: true,
            ..OpenOptions::new()
        };
        assert_eq!(errno(fs.open("/d/final", &create_new)), libc::EEXIST);
        assert_eq!(errno(fs.create_dir("/d", 0o755)), libc::EEXIST);
        assert_eq!(errno(fs.open("/d", &OpenOptions::new())), libc::EISDIR);
        assert_eq!(errno(fs.read("/d/final/x")), libc::ENOTDIR);
        assert_eq!(errno(fs.remove_dir("/d")), libc::ENOTEMPTY);
        assert_eq!(errno(fs.remove_file("/d")), libc::EISDIR);
        assert_eq!(errno(fs.read_dir("/d/final")), libc::ENOTDIR);
        assert_eq!(errno(fs.remove_file("/missing")), libc::ENOENT);
        assert_eq!(errno(fs.remove_file("/d/final/")), libc::ENOTDIR);
        assert_eq!(errno(fs.remove_file("/")), libc::EISDIR);
        assert_eq!(errno(fs.create_dir("/", 0o755)), libc::EEXIST);
        assert_eq!(errno(fs.remove_dir("/")), libc::EBUSY);
        assert_eq!(errno(fs.metadata(&"/x".repeat(3000))), libc::ENAMETOOLONG);
        assert_eq!(errno(fs.metadata("/d/final/")), libc::ENOTDIR);
        assert!(fs.exists("/d/final").unwrap());
        assert!(!fs.exists("/d/nothing").unwrap());

        // Attributes by path, hard links, a rename that will not replace.
        fs.set_permissions("/d/final", 0o600).unwrap();
        assert_eq!(fs.metadata("/d/final").unwrap().mode & 0o7777, 0o600);
        let then = std::time::UNIX_EPOCH + std::time::Duration::new(1_000_000_000, 5);
        fs.set_times("/d/final", Some(then), Some(then)).unwrap();
        let m = fs.metadata("/d/final").unwrap();
        assert_eq!((m.atime, m.mtime), (then, then));
        fs.hard_link("/d/final", "/d/again").unwrap();
        assert_eq!(fs.metadata("/d/again").unwrap().nlink, 2);
        assert_eq!(
            errno(fs.rename_noreplace("/d/again", "/d/final")),
            libc::EEXIST
        );
        fs.remove_file("/d/again").unwrap();
        assert!(fs.statfs().unwrap().total_bytes > 0);
        let nothing = OpenOptions {
            read: false,
            ..OpenOptions::new()
        };
        assert_eq!(errno(fs.open("/d/final", &nothing)), libc::EINVAL);

        fs.remove_file("/d/final").unwrap();
        fs.remove_dir("/d").unwrap();
        assert_eq!(errno(fs.metadata("/d")), libc::ENOENT);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_share_one_connection_across_threads() {
    let cluster = InProcessCluster::start(3).await;
    with_api(&cluster, |fs| {
        fs.create_dir("/t", 0o755).unwrap();
        let fs = Arc::new(fs);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let fs = (*fs).clone();
                std::thread::spawn(move || {
                    for i in 0..25 {
                        let path = format!("/t/{t}-{i}");
                        let data = pseudo_random(5000, t * 100 + i);
                        fs.write(&path, &data).unwrap();
                        assert_eq!(fs.read(&path).unwrap(), data);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a writer thread panicked");
        }
        assert_eq!(fs.read_dir("/t").unwrap().len(), 100);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_data_servers_refuse_is_reported_by_sync_and_close() {
    let cluster = InProcessCluster::start(3).await;
    let fs = with_api(&cluster, |fs| {
        let how = OpenOptions::new().write(true).create(true).clone();
        let f = fs.open("/a", &how).unwrap();
        let g = fs.open("/b", &how).unwrap();
        (fs, f, g)
    })
    .await;
    for i in 0..3 {
        cluster.stop_data(i);
    }
    let failed = tokio::task::spawn_blocking(move || {
        let (fs, f, g) = fs;
        // Buffered: the write itself is taken; sync and close say it never landed.
        f.write_at(&[7u8; 70_000], 0).unwrap();
        let synced = f.sync_all();
        g.write_at(&[8u8; 70_000], 0).unwrap();
        let closed = g.close();
        let _ = f.close();
        drop(fs);
        (synced.is_err(), closed.is_err())
    });
    // spawn_blocking threads are inside the runtime: the calls take the multi-thread
    // path (block_in_place), which this also shows works.
    assert_eq!(failed.await.unwrap(), (true, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_from_async_code_work_or_fail_clearly() {
    let cluster = InProcessCluster::start(3).await;
    with_api(&cluster, |fs| {
        fs.write("/x", b"x").unwrap();
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let fs2 = fs.clone();
        let seen = multi.block_on(async move { fs2.read("/x") }).unwrap();
        assert_eq!(seen, b"x");
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = current.block_on(async { fs.read("/x") }).unwrap_err();
        assert_eq!(e.errno(), libc::EBADF, "{e}");
        let e = current.block_on(async { Tessera::connect(&["127.0.0.1:1"], Options::new()) });
        assert!(e.is_err());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_child_fails_clearly_and_its_drops_do_not_hang() {
    let cluster = InProcessCluster::start(3).await;
    with_api(&cluster, |fs| {
        fs.write("/forked", b"parent's").unwrap();
        let f = fs.open("/forked", &OpenOptions::new()).unwrap();
        // SAFETY: the child only calls the API (which checks its pid before touching
        // anything the parent's threads own), drops and exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = fs.metadata("/forked").map_err(|e| e.errno()) == Err(libc::EBADF)
                && fs.read_many(&["/forked"])[0]
                    .as_ref()
                    .map_err(|e| e.errno())
                    == Err(libc::EBADF);
            drop(f);
            drop(fs);
            // SAFETY: ends the child at once, running no atexit handler of the parent's.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break;
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: our own child, which hung.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("the forked child hung");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child: {status}"
        );
        // The parent's connection and open file still work.
        let mut buf = [0u8; 8];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 8);
        f.close().unwrap();
    })
    .await;
}

/// A name another client made after this one listed its directory (whole, so the
/// client knows every name there) is read by an open by name and then found by a
/// lookup: neither takes it for absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_an_open_found_is_known_after_a_listing() {
    let cluster = InProcessCluster::start(3).await;
    let fs = with_api(&cluster, |fs| {
        fs.create_dir_all("/d", 0o755).unwrap();
        assert!(fs.read_dir("/d").unwrap().is_empty(), "listed whole, empty");
        fs
    })
    .await;
    let other = cluster.client().await;
    let caller = proto::meta::Caller::ROOT;
    let d = other.lookup(proto::InodeId::ROOT, b"d").await.unwrap();
    let (_, fh) = other
        .create(d.ino, b"x", 0o644, caller, true, false)
        .await
        .unwrap();
    assert_eq!(other.write(&fh, 0, b"made elsewhere").await.unwrap(), 14);
    other.release(&fh).await.unwrap();
    let (read, exists) = tokio::task::spawn_blocking(move || {
        let read = fs.read("/d/x").map_err(|e| e.to_string());
        (read, fs.exists("/d/x").map_err(|e| e.to_string()))
    })
    .await
    .unwrap();
    assert_eq!(read.as_deref(), Ok(&b"made elsewhere"[..]));
    assert_eq!(exists, Ok(true), "a name just read is not absent");
}
