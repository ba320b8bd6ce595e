//! Which metadata server serves a namespace on etcd: the one holding its owner key.
//!
//! Two servers must not serve one prefix at once yet (sessions, locks and the cluster
//! map live in a server's memory, and namespace changes are not checked transactions).
//! The owner key (`<prefix without '/'>.owner`, outside the namespace's keys) is put
//! only if absent, attached to an etcd lease that the serving process keeps alive. A
//! second server finds it held and waits (`etcd.owner_wait_ms`) for it to go: revoked
//! when its owner stops, or expired `etcd.owner_lease_ms` after its owner died. The key
//! is also the fence: the server's store commits only while etcd holds the key under
//! its lease (`EtcdStore::fenced_by`), so a server stalled past its lease (stopped, or
//! cut off from etcd) writes nothing, and stops once its keep-alive fails.

use super::{EtcdConfig, ENGINE};
use crate::kv::KvError;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{error, info, warn};

/// How often a waiting server asks whether the owner key is free again: a few polls
/// per lease, so a standby starts well within a second of the key going.
pub const OWNER_POLL: Duration = Duration::from_millis(250);
/// Keep-alives sent per lease: a lost one or two are survived.
pub const KEEPALIVES_PER_LEASE: u32 = 3;
/// How soon a renewal that failed is tried again: a call that went to a member that
/// died fails at once, and the channel picks a live one on another try.
pub const KEEPALIVE_RETRY: Duration = Duration::from_millis(250);
/// How long a stopping server waits for its revoke (the next server waits out the
/// lease otherwise).
pub const REVOKE_WAIT: Duration = Duration::from_secs(2);

/// The owner key of the namespace under `prefix` (which ends in '/': the key is not
/// under it, so no scan of the namespace sees it).
pub fn owner_key(prefix: &str) -> String {
    format!("{}.owner", prefix.trim_end_matches('/'))
}

/// The lease length etcd is asked for, in whole seconds (its unit), at least one.
pub fn lease_secs(owner_lease_ms: u64) -> i64 {
    owner_lease_ms.div_ceil(1000).max(1) as i64
}

/// The owner key, held while this value lives: kept alive on a runtime of its own,
/// revoked when dropped.
pub struct Owner {
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    client: Client,
    lease: i64,
    /// The owner key (see [`owner_key`]), or the live key of [`Owner::register`].
    key: Vec<u8>,
    /// Turns `true` once the lease is known lost (expired, or not renewed in time).
    lost: watch::Receiver<bool>,
}

impl Owner {
    /// Takes the owner key of `config.prefix` for `who` (an address and process, for
    /// the log of a server that finds it held), waiting up to `config.owner_wait_ms`
    /// for a holder's lease to go. Blocking.
    pub fn acquire(config: &EtcdConfig, who: &str) -> Result<Owner, KvError> {
        let key = owner_key(&config.prefix).into_bytes();
        Owner::hold(config, "etcd-owner", "owner lease", key, |key| async move {
            take(config, who).await.map(|held| (held, key))
        })
    }

    /// Puts `key` (the whole etcd key, prefix included) with `value` under a lease of
    /// `config.owner_lease_ms`, kept alive as the owner key is; fails if the key
    /// exists. What a metadata server on a shared prefix says it is alive with
    /// (`TxnStore::hold_live`). Blocking.
    pub fn register(config: &EtcdConfig, key: Vec<u8>, value: &[u8]) -> Result<Owner, KvError> {
        Owner::hold(config, "etcd-live", "server lease", key, |key| async move {
            let mut client = connect(config).await?;
            match put_if_absent(&mut client, &key, value, config).await? {
                Ok(lease) => Ok(((client, lease), key)),
                Err(_) => Err(KvError::Engine {
                    engine: ENGINE,
                    message: format!("live key {} exists already", crate::kv::Escaped(&key)),
                }),
            }
        })
    }

    /// Runs `put` (which takes `key` under a new lease) on a runtime of the holder's
    /// own (its threads named `thread`), then keeps the lease alive there; `what` names
    /// the lease in the log.
    fn hold<F, Fut>(
        config: &EtcdConfig,
        thread: &str,
        what: &'static str,
        key: Vec<u8>,
        put: F,
    ) -> Result<Owner, KvError>
    where
        F: FnOnce(Vec<u8>) -> Fut,
        Fut: std::future::Future<Output = Result<((Client, i64), Vec<u8>), KvError>>,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(thread)
            .enable_all()
            .build()
            .map_err(|e| KvError::from_io(ENGINE, &e))?;
        let ((client, lease), key) = runtime.block_on(put(key))?;
        let (tx, lost) = watch::channel(false);
        let lifetime = Duration::from_millis(config.owner_lease_ms);
        let period = lifetime / KEEPALIVES_PER_LEASE;
        let renew = keep_alive(client.clone(), lease, period, lifetime, tx, what);
        runtime.spawn(renew);
        Ok(Owner {
            runtime: Some(runtime),
            client,
            lease,
            key,
            lost,
        })
    }

    /// The owner key and the lease it is held under: what fences the store's commits
    /// (`EtcdStore::fenced_by`).
    pub fn fence(&self) -> (String, i64) {
        (String::from_utf8_lossy(&self.key).into_owned(), self.lease)
    }

    /// Returns once the lease is lost: another server may hold the key now, so this
    /// one must stop serving.
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        // An error: the keep-alive task ended, which it does only when lost.
        let _ = lost.wait_for(|l| *l).await;
    }

    /// Stops renewing without revoking, as a process killed with SIGKILL does: the key
    /// goes when the lease expires. For tests.
    #[cfg(any(test, feature = "local-etcd"))]
    pub fn abandon(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl crate::kv::KeepsAlive for Owner {
    fn lost(&self) -> bool {
        *self.lost.borrow()
    }

    #[cfg(test)]
    fn abandon(self: Box<Self>) {
        Owner::abandon(*self)
    }
}

impl Drop for Owner {
    /// Revokes the lease (waiting at most [`REVOKE_WAIT`] on a plain channel, so it
    /// works on any thread) so that a standby starts at once.
    fn drop(&mut self) {
        let Some(rt) = self.runtime.take() else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (mut leases, lease) = (self.client.lease_client(), self.lease);
        rt.spawn(async move {
            let _ = tx.send(leases.revoke(lease).await);
        });
        match rx.recv_timeout(REVOKE_WAIT) {
            Ok(Ok(_)) => info!(key = %crate::kv::Escaped(&self.key), "key released"),
            Ok(Err(e)) => {
                warn!(key = %crate::kv::Escaped(&self.key), error = %e, "key not released: it expires with its lease")
            }
            Err(_) => {
                warn!(key = %crate::kv::Escaped(&self.key), "key not released in time: it expires with its lease")
            }
        }
        rt.shutdown_background();
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> KvError {
    KvError::Unavailable {
        engine: ENGINE,
        message: format!("{what}: {e}"),
    }
}

/// Connects and takes the owner key under a new lease once it is absent, polling every
/// [`OWNER_POLL`] until `owner_wait_ms` has passed.
async fn take(config: &EtcdConfig, who: &str) -> Result<(Client, i64), KvError> {
    let mut client = connect(config).await?;
    let key = owner_key(&config.prefix);
    let deadline = Instant::now() + Duration::from_millis(config.owner_wait_ms);
    let (mut said, mut unanswered) = (false, false);
    loop {
        // The lease is granted only once the key looks free: one granted earlier would
        // expire during a long wait, unrenewed.
        let looked = match holder(&mut client, &key).await {
            Ok(None) => {
                match put_if_absent(&mut client, key.as_bytes(), who.as_bytes(), config).await {
                    Ok(Ok(lease)) => {
                        info!(%key, "owner key taken: this server serves the namespace");
                        return Ok((client, lease));
                    }
                    // Taken meanwhile by another server.
                    Ok(Err(holder)) => Ok(holder),
                    Err(e) => Err(e),
                }
            }
            Ok(Some(h)) => Ok(h),
            Err(e) => Err(e),
        };
        let holder = match looked {
            Ok(h) => h,
            // A member away (stopped, restarting) fails the call that went to it; a
            // standby keeps waiting through that, as the serving server does.
            Err(e @ KvError::Unavailable { .. }) if Instant::now() < deadline => {
                if !unanswered {
                    warn!(error = %e, "etcd did not answer; asking again");
                    unanswered = true;
                }
                tokio::time::sleep(OWNER_POLL).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if Instant::now() >= deadline {
            return Err(KvError::Engine {
                engine: ENGINE,
                message: format!(
                    "the namespace under {:?} is served by {holder} (its owner key {key} \
                     is held); two metadata servers on one prefix are not safe yet. It \
                     goes when that server stops, or etcd.owner_lease_ms after it died; \
                     etcd.owner_wait_ms says how long a server waits for it",
                    config.prefix
                ),
            });
        }
        if !said {
            info!(%key, %holder, "owner key held: waiting for it to go");
            said = true;
        }
        tokio::time::sleep(OWNER_POLL).await;
    }
}

/// Who holds the owner key of `config.prefix` (the server's address and pid), if a
/// server does: what an offline tool asks before it touches the namespace. Blocking;
/// fails if etcd does not answer within `config.connect_timeout_ms` and
/// `request_timeout_ms`.
pub fn current_holder(config: &EtcdConfig) -> Result<Option<String>, KvError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| KvError::from_io(ENGINE, &e))?;
    runtime.block_on(async {
        let mut client = connect(config).await?;
        holder(&mut client, &owner_key(&config.prefix)).await
    })
}

/// A client of the cluster `config` names, with its connect and request timeouts.
async fn connect(config: &EtcdConfig) -> Result<Client, KvError> {
    let options = ConnectOptions::default()
        .with_connect_timeout(Duration::from_millis(config.connect_timeout_ms))
        .with_timeout(Duration::from_millis(config.request_timeout_ms));
    Client::connect(config.endpoints.clone(), Some(options))
        .await
        .map_err(|e| unavailable("connecting", e))
}

/// The value of the owner key (its holder), if it exists.
async fn holder(client: &mut Client, key: &str) -> Result<Option<String>, KvError> {
    let resp = client
        .get(key, None)
        .await
        .map_err(|e| unavailable("reading the owner key", e))?;
    Ok(resp
        .kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
}

/// Grants a lease and puts `key` = `who` under it if the key is absent: `Ok(lease)`,
/// or `Err(holder)` (the lease revoked) when another server put it first.
async fn put_if_absent(
    client: &mut Client,
    key: &[u8],
    who: &[u8],
    config: &EtcdConfig,
) -> Result<Result<i64, String>, KvError> {
    let lease = client
        .lease_grant(lease_secs(config.owner_lease_ms), None)
        .await
        .map_err(|e| unavailable("granting a lease", e))?
        .id();
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            who,
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key, None)]);
    let resp = client
        .txn(txn)
        .await
        .map_err(|e| unavailable("taking the owner key", e))?;
    if resp.succeeded() {
        return Ok(Ok(lease));
    }
    let _ = client.lease_revoke(lease).await;
    let holder = match resp.op_responses().first() {
        Some(etcd_client::TxnOpResponse::Get(g)) => g
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
        _ => None,
    };
    Ok(Err(holder.unwrap_or_default()))
}

/// Renews `lease` every `period` ([`KEEPALIVE_RETRY`] after a failed try); tells `lost`
/// when etcd says it expired, or when no renewal succeeded for a whole `lifetime`
/// (counted from the last good renewal's sending; every wait is bounded, so it is
/// noticed within a period of that). What keeps a server that lost the key from
/// writing is the fence on every commit (`EtcdStore::fenced_by`); this tells it to stop
/// serving.
async fn keep_alive(
    client: Client,
    lease: i64,
    period: Duration,
    lifetime: Duration,
    lost: watch::Sender<bool>,
    what: &'static str,
) {
    let mut renewed = Instant::now();
    let mut stream = None;
    // Renewals are failing: the next is tried soon (said once, and once when one
    // succeeds again).
    let mut failing = false;
    loop {
        // Never past the lease's end unnoticed: the wait and each attempt are bounded.
        let left = lifetime.saturating_sub(renewed.elapsed());
        let pause = if failing { KEEPALIVE_RETRY } else { period };
        tokio::time::sleep(pause.min(left)).await;
        // Before the request: etcd restarts the lease when it handles it, later than
        // this, so the lease counted from here ends no later than etcd's.
        let sent = Instant::now();
        let attempt = async {
            if stream.is_none() {
                stream = client.lease_client().keep_alive(lease).await.ok();
            }
            match stream.as_mut() {
                Some((keeper, answers)) => match keeper.keep_alive().await {
                    Ok(()) => match answers.message().await {
                        Ok(Some(r)) => Some(r.ttl()),
                        _ => None,
                    },
                    Err(_) => None,
                },
                None => None,
            }
        };
        // A renewal that takes a whole period is a failed one (etcd-client's own wait
        // for a first answer is several seconds, longer than a short lease).
        let ttl = tokio::time::timeout(period, attempt).await.ok().flatten();
        match ttl {
            Some(t) if t > 0 => {
                if failing {
                    info!(what, "the lease is renewed again");
                    failing = false;
                }
                renewed = sent;
            }
            Some(_) => {
                error!(
                    what,
                    "the lease expired: other servers take over what this one held"
                );
                let _ = lost.send(true);
                return;
            }
            None => {
                // A broken stream is made again on the next try, soon: one failed try
                // (the member it went to died) must not cost a whole period.
                stream = None;
                if !failing {
                    failing = true;
                    warn!(
                        renewed_ms_ago = renewed.elapsed().as_millis() as u64,
                        what, "the lease was not renewed: trying again"
                    );
                }
                if renewed.elapsed() >= lifetime {
                    error!(
                        what,
                        "the lease was not renewed in time: it may have expired"
                    );
                    let _ = lost.send(true);
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::etcd::local::LocalEtcd;

    #[test]
    fn the_owner_key_is_outside_the_namespace_and_leases_are_whole_seconds() {
        assert_eq!(owner_key("tessera/"), "tessera.owner");
        assert!(!owner_key("t7/").starts_with("t7/"));
        assert_eq!(lease_secs(5000), 5);
        assert_eq!(lease_secs(1500), 2);
        assert_eq!(lease_secs(1), 1);
    }

    /// The shared test etcd (held by the test, so that it stops with the last holder)
    /// and a configuration of a prefix of the test's own.
    fn etcd_config() -> Option<(std::sync::Arc<LocalEtcd>, EtcdConfig)> {
        if !LocalEtcd::present_for_tests() {
            return None;
        }
        let etcd = LocalEtcd::shared().unwrap();
        let config = etcd.config();
        Some((
            etcd,
            EtcdConfig {
                owner_lease_ms: 1000,
                owner_wait_ms: 0,
                ..config
            },
        ))
    }

    /// A second server is refused while the first holds the key, and gets it at once
    /// when the first stops.
    #[test]
    fn a_second_owner_is_refused_until_the_first_stops() {
        let Some((_etcd, config)) = etcd_config() else {
            return;
        };
        let a = Owner::acquire(&config, "A").unwrap();
        let e = Owner::acquire(&config, "B").err().unwrap().to_string();
        assert!(e.contains("served by A"), "{e}");
        drop(a);
        let t = Instant::now();
        let b = Owner::acquire(&config, "B").unwrap();
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        drop(b);
    }

    /// A standby waiting for the key gets it once the lease of an owner that died
    /// (no revoke, no renewal) expires, not before. Guards against the standby's own
    /// lease, once granted before its wait, expiring during it ("lease not found").
    #[test]
    fn a_waiting_standby_takes_over_when_a_dead_owners_lease_expires() {
        let Some((_etcd, config)) = etcd_config() else {
            return;
        };
        let a = Owner::acquire(&config, "A").unwrap();
        let waiting = EtcdConfig {
            owner_wait_ms: 20_000,
            ..config.clone()
        };
        // Alive and renewing: the key stays A's for several leases.
        let held = EtcdConfig {
            owner_wait_ms: 2_500,
            ..config.clone()
        };
        assert!(Owner::acquire(&held, "B").is_err());
        let t = Instant::now();
        a.abandon();
        let b = Owner::acquire(&waiting, "B").unwrap();
        let took = t.elapsed();
        // The lease (1 s asked, at least 1.5 s as etcd grants it) was renewed at most a
        // third of it before the abandon: the rest of it must have passed.
        assert!(
            took >= Duration::from_millis(500),
            "before the lease expired: {took:?}"
        );
        assert!(took < Duration::from_secs(10), "{took:?}");
        drop(b);
    }

    /// A store fenced by an owner key it lost writes nothing, plain or checked, while
    /// the store of the server that took the key over writes: two servers never both
    /// change the namespace, however long the first takes to notice.
    #[test]
    fn a_store_fenced_by_a_lost_owner_key_writes_nothing() {
        use crate::kv::{EtcdStore, KvStore, ReadCheck, TxnStore, WriteBatch};
        let Some((_etcd, config)) = etcd_config() else {
            return;
        };
        let batch = |k: &str| {
            let mut b = WriteBatch::new();
            b.put(k.as_bytes().to_vec(), b"v".to_vec());
            b
        };
        let a = Owner::acquire(&config, "A").unwrap();
        let (key, lease) = a.fence();
        let store_a = EtcdStore::connect(&config).unwrap().fenced_by(key, lease);
        store_a.commit(batch("a-before")).unwrap();
        // A stalls (stops renewing); B takes the key once A's lease is gone.
        a.abandon();
        let standby = EtcdConfig {
            owner_wait_ms: 10_000,
            ..config.clone()
        };
        let b = Owner::acquire(&standby, "B").unwrap();
        let e = store_a.commit(batch("a-late")).unwrap_err();
        assert!(e.to_string().contains("owner key"), "{e}");
        let absent = ReadCheck {
            key: b"a-late-checked".to_vec(),
            revision: None,
        };
        let e = store_a
            .commit_if(&[absent], batch("a-late-checked"))
            .unwrap_err();
        assert!(e.to_string().contains("owner key"), "{e}");
        let (key, lease) = b.fence();
        let store_b = EtcdStore::connect(&config).unwrap().fenced_by(key, lease);
        store_b.commit(batch("b-after")).unwrap();
        assert!(store_b.get(b"a-before").unwrap().is_some());
        assert!(store_b.get(b"b-after").unwrap().is_some());
        assert!(
            store_b.get(b"a-late").unwrap().is_none(),
            "a fenced write landed"
        );
        assert!(store_b.get(b"a-late-checked").unwrap().is_none());
        drop(b);
    }

    /// An owner cut off from etcd past its lease is told, so its server stops rather
    /// than serve beside a standby that took the key.
    #[test]
    fn an_owner_cut_off_from_etcd_past_its_lease_learns_it_lost_the_key() {
        if etcd_config().is_none() {
            return;
        }
        let mut etcd = LocalEtcd::start(1).unwrap();
        let config = EtcdConfig {
            owner_lease_ms: 1000,
            owner_wait_ms: 0,
            ..etcd.config()
        };
        let owner = Owner::acquire(&config, "A").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let within = |limit| rt.block_on(async { tokio::time::timeout(limit, owner.lost()).await });
        let alive = within(Duration::from_secs(3));
        assert!(alive.is_err(), "lost while etcd answered");
        let t = Instant::now();
        etcd.kill(0);
        let told = within(Duration::from_secs(10));
        assert!(told.is_ok(), "not told within 10 s");
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        eprintln!("told {:?} after etcd went", t.elapsed());
    }
}
