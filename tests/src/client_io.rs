//! Whole-file writes and reads through the `Client` API, for tests that kill servers
//! around them.

use fs_client::{Client, Result};
use proto::meta::Caller;
use proto::InodeId;

const ROOT_CALLER: Caller = Caller::ROOT;
const MIB: usize = 1 << 20;

/// Creates `name` in the root directory, writes `data` in 1 MiB writes, fsyncs and
/// closes it; `Ok` means every byte was acknowledged as durable.
pub async fn write_fsync(c: &Client, name: &str, data: &[u8]) -> Result<()> {
    let (_, fh) = c
        .create(
            InodeId::ROOT,
            name.as_bytes(),
            0o644,
            ROOT_CALLER,
            true,
            false,
        )
        .await?;
    let mut r = Ok(());
    for (i, part) in data.chunks(MIB).enumerate() {
        r = c.write(&fh, (i * MIB) as u64, part).await.map(|_| ());
        if r.is_err() {
            break;
        }
    }
    if r.is_ok() {
        r = c.fsync(&fh).await;
    }
    let closed = c.release(&fh).await;
    r.and(closed)
}

/// Reads the whole of `name` in the root directory.
pub async fn read_whole(c: &Client, name: &str) -> Result<Vec<u8>> {
    let attr = c.lookup(InodeId::ROOT, name.as_bytes()).await?;
    let (_, fh) = c.open(attr.ino, false).await?;
    let data = c.read(&fh, 0, attr.size as usize).await;
    c.release(&fh).await?;
    data
}

/// A seed from environment variable `var`, or from the clock; printed with how to
/// replay it.
pub fn seed_from_env(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
                | 1
        });
    eprintln!("seed {seed} ({var}={seed} replays it)");
    seed
}
