//! The library API by path (`fs_client::api`, issue 29 item 1) against a real cluster:
//! three data servers and a metadata server in this process, on 127.0.0.1. Its calls
//! block, so each test drives it from a thread of its own while the cluster runs on the
//! test's runtime; a second, plain `Client` checks that what one wrote the other reads.

use fs_client::api::{FileType, OpenOptions, Options, Tessera};
use fs_client::ClientError;
use std::sync::Arc;
use tessera_tests::{client_io, pseudo_random, sha256_hex, InProcessCluster};

/// Runs `f` on a thread outside the runtime with an API connection to `cluster`.
async fn with_api<R: Send + 'static>(
    cluster: &InProcessCluster,
    f: impl FnOnce(Tessera) -> R + Send + 'static,
) -> R {
    let options = Options {
        config: cluster.client_config(),
        ..Options::new()
    };
    let addr = cluster.meta_addr();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let fs = Tessera::connect(&[addr], options).expect("the API connects");
        let _ = tx.send(f(fs));
    });
    rx.await.expect("the API thread ends with a result")
}

fn errno(r: Result<impl std::fmt::Debug, ClientError>) -> i32 {
    r.expect_err("the call must fail").errno()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_written_read_and_listed_by_path() {
    let cluster = InProcessCluster::start(3).await;
    let big = pseudo_random(9 << 20, 29);
    let big2 = big.clone();
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

        // Many small files, read at once, in the order asked.
        let names: Vec<String> = (0..200).map(|i| format!("/data/small/{i:04}")).collect();
        fs.create_dir("/data/small", 0o755).unwrap();
        for (i, n) in names.iter().enumerate() {
            fs.write(n, &pseudo_random(1000 + i, i as u64)).unwrap();
        }
        let mut asked = names.clone();
        asked.push("/data/small/missing".into());
        let got = fs.read_many(&asked);
        for (i, r) in got[..200].iter().enumerate() {
            assert_eq!(
                r.as_ref().unwrap(),
                &pseudo_random(1000 + i, i as u64),
                "file {i}"
            );
        }
        assert_eq!(got[200].as_ref().unwrap_err().errno(), libc::ENOENT);

        let mut listed: Vec<String> = fs
            .read_dir("/data/small")
            .unwrap()
            .into_iter()
            .map(|e| {
                assert_eq!(e.kind, FileType::File);
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

        // A directory renamed by this client is found under its new name at once.
        fs.create_dir_all("/a/b", 0o755).unwrap();
        fs.write("/a/b/f", b"x").unwrap();
        assert_eq!(fs.read("/a/b/f").unwrap(), b"x");
        fs.rename("/a", "/z").unwrap();
        assert_eq!(fs.read("/z/b/f").unwrap(), b"x");
        assert_eq!(errno(fs.read("/a/b/f")), libc::ENOENT);

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
