//! Whole-cluster tests in one process, through the `Client` API.

use proto::meta::Caller;
use proto::{ErrorCode, InodeId};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_tests::{pseudo_random, sha256_hex, InProcessCluster};

const ROOT_CALLER: Caller = Caller::ROOT;

/// Every chunk file under `dir`.
fn chunk_files(dir: &Path) -> Vec<PathBuf> {
    tessera_tests::chunk_tree::chunk_files_under(dir)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_and_read_back_100_mib_spread_over_all_data_servers() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let data = pseudo_random(100 << 20, 42);
    let (attr, fh) = client
        .create(InodeId::ROOT, b"big.bin", 0o644, ROOT_CALLER, true, false)
        .await
        .unwrap();
    assert_eq!(attr.size, 0);
    assert_eq!(client.write(&fh, 0, &data).await.unwrap(), data.len());
    client.fsync(&fh).await.unwrap();
    client.release(&fh).await.unwrap();

    // A second client sees the committed length and the same bytes.
    let other = cluster.client().await;
    let attr = other.lookup(InodeId::ROOT, b"big.bin").await.unwrap();
    assert_eq!(attr.size, data.len() as u64);
    let (_, fh) = other.open(attr.ino, false).await.unwrap();
    let back = other.read(&fh, 0, data.len() + 4096).await.unwrap();
    assert_eq!(back.len(), data.len(), "reads stop at the end of the file");
    assert_eq!(sha256_hex(&back), sha256_hex(&data));
    other.release(&fh).await.unwrap();

    // 25 chunks of 4 MiB, three copies each: every data server holds every chunk. On a
    // loaded machine a server's lease can lapse during the write and its chain go on
    // without it; it then gets the chunks when it is back (chain recovery), so this
    // waits for the cluster to be whole and the copies to arrive, within a bound.
    cluster.wait_healthy().await;
    // Polled here rather than with `wait_until`, to name each server's count on failure.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let held: Vec<usize> = cluster
            .data_dirs
            .iter()
            .map(|d| chunk_files(d).len())
            .collect();
        if held.iter().all(|&n| n == 25) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "chunks held per data server after 60 s: {held:?}, 25 each expected"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupted_copy_is_read_from_another_replica_and_never_returned() {
    let cluster = InProcessCluster::start(3).await;
    let client = cluster.client().await;
    let data = pseudo_random(3 << 20, 7);
    let (_, fh) = client
        .create(InodeId::ROOT, b"c.bin", 0o644, ROOT_CALLER, true, false)
        .await
        .unwrap();
    client.write(&fh, 0, &data).await.unwrap();
    client.fsync(&fh).await.unwrap();
    client.release(&fh).await.unwrap();

    let files: Vec<PathBuf> = cluster
        .data_dirs
        .iter()
        .flat_map(|d| chunk_files(d))
        .collect();
    assert_eq!(
        files.len(),
        3,
        "a 3 MiB file is one chunk, on three servers"
    );
    let ino = client.lookup(InodeId::ROOT, b"c.bin").await.unwrap().ino;
    // Flip one byte of the last stored data byte (the chunk file ends with the data
    // area) of one copy after another: while a good copy is left, reads use it.
    for (i, file) in files.iter().enumerate() {
        let mut bytes = std::fs::read(file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x5a;
        std::fs::write(file, &bytes).unwrap();
        // A new client each time: a client's cache keeps bytes of an unchanged file.
        let client = cluster.client().await;
        let (_, fh) = client.open(ino, false).await.unwrap();
        let read = client.read(&fh, 0, data.len()).await;
        if i + 1 < files.len() {
            assert!(read.unwrap() == data, "{} bad copies of 3", i + 1);
        } else {
            let err = read.unwrap_err();
            assert_eq!(err.code(), ErrorCode::Corrupt, "{err}");
        }
        // The first MiB is in untouched blocks and still reads correctly.
        let head = client.read(&fh, 0, 1 << 20).await.unwrap();
        assert_eq!(head, data[..1 << 20]);
        client.release(&fh).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn truncate_unlink_rename_and_sizes_through_the_client() {
    let cluster = InProcessCluster::start(3).await;
    let c = cluster.client().await;
    let dir = c
        .mkdir(InodeId::ROOT, b"d", 0o755, ROOT_CALLER)
        .await
        .unwrap();
    let (a, fh) = c
        .create(dir.ino, b"f", 0o600, ROOT_CALLER, true, false)
        .await
        .unwrap();
    let data = pseudo_random(9 << 20, 3);
    c.write(&fh, 0, &data).await.unwrap();
    // Uncommitted writes already show in this client's attributes.
    assert_eq!(c.getattr(a.ino).await.unwrap().size, data.len() as u64);
    c.flush(&fh).await.unwrap();
    // Shrink then grow: the cut-off bytes come back as zeros.
    let set = |size| proto::SetAttr {
        size: Some(size),
        ..Default::default()
    };
    c.setattr(a.ino, set(5 << 20)).await.unwrap();
    c.setattr(a.ino, set(6 << 20)).await.unwrap();
    let back = c.read(&fh, 0, 6 << 20).await.unwrap();
    assert_eq!(back[..5 << 20], data[..5 << 20]);
    assert!(
        back[5 << 20..].iter().all(|&b| b == 0),
        "truncated bytes read as zeros"
    );
    c.release(&fh).await.unwrap();

    let (_, fh2) = c
        .create(dir.ino, b"g", 0o600, ROOT_CALLER, true, false)
        .await
        .unwrap();
    c.write(&fh2, 0, b"replacement").await.unwrap();
    c.release(&fh2).await.unwrap();
    c.rename(
        dir.ino,
        b"g",
        dir.ino,
        b"f",
        proto::meta::RenameMode::Replace,
    )
    .await
    .unwrap();
    let f = c.lookup(dir.ino, b"f").await.unwrap();
    assert_eq!(f.size, 11);
    let names: Vec<_> = c
        .readdir_all(dir.ino)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![b"f".to_vec()]);
    c.unlink(dir.ino, b"f").await.unwrap();
    let err = c.lookup(dir.ino, b"f").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    c.rmdir(InodeId::ROOT, b"d").await.unwrap();
}
