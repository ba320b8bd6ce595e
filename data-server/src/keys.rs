//! How a data server checks a handshake: servers by the cluster key, clients by the key
//! it derives itself from the cluster key for their claim (name, key id, capabilities),
//! and the revocation list it pulls from the metadata server every
//! [`REVOCATION_POLL`]. No key is asked for or sent: a client is checked with the
//! metadata server away as with it up; the list kept is the last one pulled, also in
//! the data directory ([`REVOKED_FILE`]), so that a data server started while the
//! metadata server is away refuses what was revoked before.

use parking_lot::Mutex;
use proto::auth::{Claim, KeyId};
use proto::meta::cluster::{RevocationPage, Revocations, MAX_REVOCATIONS};
use proto::Request;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tracing::{info, warn};
use transport::auth::{Lookup, LookupFuture};
use transport::{Endpoint, Key, Link, Listener, PeerIdentity, Role, Verifier};

/// How often the revocation list is pulled: a revoked key is refused by every data
/// server, and its connections there closed, within this time (once the metadata
/// server is reachable).
pub const REVOCATION_POLL: Duration = Duration::from_secs(10);

/// The revocation list's copy in the data directory: a header line, then one
/// `NAME KEY_ID` line per revoked key (names have no spaces: `check_peer_name`).
pub const REVOKED_FILE: &str = "revoked-keys";

/// The first line of [`REVOKED_FILE`].
const REVOKED_HEADER: &str = "tessera-revoked-keys 1";

/// The verifier of a data server's listener.
#[derive(Clone)]
pub struct DataVerifier(Arc<Inner>);

struct Inner {
    cluster: Key,
    /// Connects out with the server's credentials (no verifier of its own).
    ep: Endpoint,
    meta: Link,
    list: Mutex<RevocationList>,
    /// Where the list is kept across restarts (`None`: in memory only).
    saved: Option<PathBuf>,
}

/// The revoked keys known here, and the metadata server's version of the last one
/// in its epoch.
#[derive(Default)]
struct RevocationList {
    version: u64,
    epoch: Option<u64>,
    revoked: HashSet<(String, KeyId)>,
}

impl DataVerifier {
    /// A verifier that pulls revocations from the metadata server at `meta_addr`
    /// through `ep`, starting from the list saved in `dir` (if any), where it keeps it.
    pub fn new(cluster: Key, ep: Endpoint, meta_addr: String, dir: Option<&Path>) -> DataVerifier {
        let saved = dir.map(|d| d.join(REVOKED_FILE));
        let revoked = saved.as_deref().map(load_revoked).unwrap_or_default();
        DataVerifier(Arc::new(Inner {
            cluster,
            ep,
            meta: Link::new(meta_addr),
            list: Mutex::new(RevocationList {
                revoked,
                ..RevocationList::default()
            }),
            saved,
        }))
    }

    /// Pulls the revocations not seen yet, adds each to the list and then closes the
    /// connections of its key (in that order: see `Verifier::revoked`). Returns how
    /// many were new; an error leaves the list as it was (kept across outages).
    pub async fn pull(&self, listener: &Weak<Listener>) -> Result<usize, crate::DataError> {
        let mut new = 0;
        // Bounded: every page but the last is full, and the list holds at most
        // MAX_REVOCATIONS.
        // (and one more page for a new epoch's restart from the beginning).
        let max_pages = MAX_REVOCATIONS / proto::meta::cluster::MAX_REVOCATIONS_PER_PAGE + 3;
        for _ in 0..max_pages {
            let since = self.0.list.lock().version;
            let page = self.0.ask_meta(since).await?;
            {
                let mut list = self.0.list.lock();
                if list.epoch != Some(page.epoch) {
                    // Versions of another start of the metadata server mean nothing
                    // here: pull the whole list again (adding to the set is harmless).
                    list.epoch = Some(page.epoch);
                    if since != 0 {
                        list.version = 0;
                        continue;
                    }
                }
            }
            let mut full = false;
            for r in &page.revoked {
                let fresh = {
                    let mut list = self.0.list.lock();
                    if list.revoked.len() >= MAX_REVOCATIONS {
                        full = true;
                        break;
                    }
                    list.revoked.insert((r.name.clone(), r.key_id))
                };
                if !fresh {
                    continue;
                }
                new += 1;
                let closed = listener
                    .upgrade()
                    .map_or(0, |l| l.close_key(&r.name, &r.key_id));
                info!(name = %r.name, key_id = %r.key_id, closed, "client key revoked");
            }
            if full {
                // The version stays where the list stopped, so nothing is skipped.
                warn!("more than {MAX_REVOCATIONS} revocations: the rest not kept");
                break;
            }
            let mut list = self.0.list.lock();
            list.version = list.version.max(page.version);
            if page.done {
                break;
            }
        }
        if new > 0 {
            self.save().await;
        }
        Ok(new)
    }

    /// Writes the list to the data directory (a new file renamed over the old one, so
    /// a crash leaves one or the other). A failure is logged: the list in memory still
    /// holds, and the next revocation writes it again.
    async fn save(&self) {
        let Some(dir) = self.0.saved.as_deref().and_then(Path::parent) else {
            return;
        };
        let (dir, text) = (
            dir.to_path_buf(),
            render_revoked(&self.0.list.lock().revoked),
        );
        let wrote = tokio::task::spawn_blocking(move || save_revoked(&dir, &text)).await;
        if let Err(e) = wrote
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            warn!(error = %e, "cannot save the revocation list; kept in memory");
        }
    }

    /// Pulls the revocation list now and every [`REVOCATION_POLL`]; ends with the
    /// listener.
    pub fn watch(&self, listener: Weak<Listener>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REVOCATION_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if listener.strong_count() == 0 {
                    return;
                }
                if let Err(e) = me.pull(&listener).await {
                    // The metadata server is away: the last list stands until it is back.
                    warn!(error = %e, "cannot pull the revocation list; keeping the last one");
                }
            }
        })
    }
}

impl Inner {
    async fn ask_meta(&self, since: u64) -> Result<RevocationPage, crate::DataError> {
        let conn = self.meta.get(&self.ep).await?;
        let limit = self.ep.config().max_msg_bytes;
        let req = Request::new(Revocations { since });
        let r = transport::rpc::call::<_, crate::DataError>(&conn, &req, limit).await;
        if let Err(crate::DataError::Transport(e)) = &r {
            self.meta.call_failed(&conn, e);
        }
        r
    }

    fn is_revoked(&self, name: &str, key_id: &KeyId) -> bool {
        // A lookup by borrowed parts would need another key type; names are short.
        self.list
            .lock()
            .revoked
            .contains(&(name.to_string(), *key_id))
    }
}

impl Verifier for DataVerifier {
    fn lookup(&self, name: &str, claim: Option<&Claim>) -> LookupFuture {
        let found = match claim {
            None if name.starts_with(proto::auth::SERVER_NAME_PREFIX) => Lookup::Known {
                key: self.0.cluster.clone(),
                role: Role::Server,
            },
            None => Lookup::Refused {
                key: self.0.cluster.clone(),
                why: "a client without a key id",
            },
            // Every claim costs one derivation, whatever the name: no name oracle.
            Some(claim) => {
                let key = self.0.cluster.derive_client(name, claim);
                match self.0.is_revoked(name, &claim.key_id) {
                    true => Lookup::Refused {
                        key,
                        why: "revoked",
                    },
                    false => Lookup::Known {
                        key,
                        role: Role::Client(claim.caps.clone()),
                    },
                }
            }
        };
        Box::pin(async move { found })
    }

    fn revoked(&self, who: &PeerIdentity) -> bool {
        match (&who.role, &who.key_id) {
            (Role::Server, _) => false,
            (Role::Client(_), Some(id)) => self.0.is_revoked(&who.name, id),
            (Role::Client(_), None) => true,
        }
    }
}

/// The text of [`REVOKED_FILE`] for `revoked`, in a stable order.
fn render_revoked(revoked: &HashSet<(String, KeyId)>) -> String {
    let mut lines: Vec<String> = revoked.iter().map(|(n, id)| format!("{n} {id}")).collect();
    lines.sort();
    let mut text = format!("{REVOKED_HEADER}\n");
    for line in lines {
        text.push_str(&line);
        text.push('\n');
    }
    text
}

/// Parses [`REVOKED_FILE`]'s text: the revoked keys it names, at most
/// [`MAX_REVOCATIONS`]; a line that is not a valid name and a 32-hex-digit key id is
/// skipped (and counted in the error), as is a file of another format.
fn parse_revoked(text: &str) -> (HashSet<(String, KeyId)>, usize) {
    let mut lines = text.lines();
    if lines.next() != Some(REVOKED_HEADER) {
        return (HashSet::new(), 1);
    }
    let (mut set, mut bad) = (HashSet::new(), 0);
    for line in lines {
        let mut id = [0u8; proto::auth::KEY_ID_BYTES];
        let parsed = match line.split_once(' ') {
            Some((name, hex_id)) if proto::auth::check_peer_name(name).is_ok() => {
                hex::decode_to_slice(hex_id, &mut id).map(|()| name)
            }
            _ => Err(hex::FromHexError::InvalidStringLength),
        };
        match parsed {
            Ok(name) if set.len() < MAX_REVOCATIONS => {
                set.insert((name.to_string(), KeyId(id)));
            }
            _ => bad += 1,
        }
    }
    (set, bad)
}

/// The list saved at `path`: empty when there is none; a file that cannot be read, or
/// lines that cannot be parsed, are logged and left out.
fn load_revoked(path: &Path) -> HashSet<(String, KeyId)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashSet::new(),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot read the saved revocation list");
            return HashSet::new();
        }
    };
    let (set, bad) = parse_revoked(&text);
    if bad > 0 {
        warn!(path = %path.display(), bad, "lines of the saved revocation list left out");
    }
    info!(
        revoked = set.len(),
        "revocation list read from the data directory"
    );
    set
}

/// Writes [`REVOKED_FILE`] in `dir` durably, as the store saves its own small files.
fn save_revoked(dir: &Path, text: &str) -> Result<(), crate::DataError> {
    let tmp = format!("{REVOKED_FILE}.new");
    crate::store::dirs::save_atomically(dir, REVOKED_FILE, &tmp, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proto::meta::cluster::Revoked;
    use proto::meta::{ClusterRequest, MetaRequest};
    use transport::{Backend, Connection, Handler, HandlerFuture, TransportConfig};

    /// A metadata server that answers `Revocations` from a list it is told, in one
    /// epoch it is told: versions are positions in the list, from 1.
    #[derive(Clone, Default)]
    struct FakeMeta(Arc<Mutex<(u64, Vec<Revoked>)>>);

    impl Handler for FakeMeta {
        fn handle(&self, _conn: Connection, request: Bytes) -> HandlerFuture {
            let (epoch, list) = self.0.lock().clone();
            Box::pin(async move {
                let Ok(MetaRequest::Cluster(ClusterRequest::Revocations(r))) =
                    proto::codec::decode::<MetaRequest>(&request)
                else {
                    return Bytes::new();
                };
                let page = RevocationPage {
                    revoked: list.iter().skip(r.since as usize).cloned().collect(),
                    version: list.len() as u64,
                    done: true,
                    epoch,
                };
                Bytes::from(proto::rpc::answer(&Ok(page), usize::MAX))
            })
        }
    }

    fn ep() -> Endpoint {
        Endpoint::new(
            Backend::Tcp,
            TransportConfig::default(),
            proto::PROTOCOL_VERSION,
        )
        .unwrap()
    }

    /// A [`FakeMeta`] in epoch 1 with `list`, listening: it, its listener, its address.
    async fn fake_meta(list: Vec<Revoked>) -> (FakeMeta, Listener, String) {
        let meta = FakeMeta::default();
        *meta.0.lock() = (1, list);
        let listener = ep()
            .listen("127.0.0.1:0", Arc::new(meta.clone()))
            .await
            .unwrap();
        let addr = listener.local_addr().to_string();
        (meta, listener, addr)
    }

    fn revoked(name: &str, n: u8) -> Revoked {
        Revoked {
            name: name.into(),
            key_id: KeyId([n; 16]),
        }
    }

    /// Guards against a saved revocation list that does not read back, or a damaged one
    /// that stops a start: bad lines are left out, good ones kept.
    #[test]
    fn the_saved_list_reads_back_and_bad_lines_are_left_out() {
        let set: HashSet<_> = [("ann", 1), ("bob", 2)]
            .iter()
            .map(|(n, b)| (n.to_string(), KeyId([*b; 16])))
            .collect();
        let text = render_revoked(&set);
        assert_eq!(parse_revoked(&text), (set.clone(), 0));
        let damaged = format!("{text}no-id\nbad name {}\ncid 12zz\n", KeyId([3; 16]));
        assert_eq!(parse_revoked(&damaged), (set, 3));
        assert_eq!(parse_revoked("something else\nann 00").0.len(), 0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REVOKED_FILE);
        assert!(load_revoked(&path).is_empty(), "no file: an empty list");
        save_revoked(dir.path(), &text).unwrap();
        assert_eq!(load_revoked(&path).len(), 2);
    }

    /// Guards against a data server skipping revocations whose versions the metadata
    /// server handed out again (a crash lost them before they were durable, or a store
    /// was restored, or the cluster key rotated): it pulled "after 1" and never saw the
    /// new first one.
    #[tokio::test]
    async fn another_epoch_pulls_the_whole_list_again() {
        let (meta, _listener, addr) = fake_meta(vec![revoked("ann", 1)]).await;
        let verifier = DataVerifier::new(Key::generate().unwrap(), ep(), addr, None);
        let none = Weak::new();
        assert_eq!(verifier.pull(&none).await.unwrap(), 1);
        assert!(verifier.0.is_revoked("ann", &KeyId([1; 16])));
        // The same version 1, another key, another epoch.
        *meta.0.lock() = (2, vec![revoked("bob", 2)]);
        assert_eq!(verifier.pull(&none).await.unwrap(), 1);
        assert!(verifier.0.is_revoked("bob", &KeyId([2; 16])));
        assert!(
            verifier.0.is_revoked("ann", &KeyId([1; 16])),
            "the list only grows"
        );
    }

    /// Guards against a data server started while the metadata server is away letting
    /// in a key revoked before (its list lived in memory only).
    #[tokio::test]
    async fn a_data_server_started_with_the_metadata_server_away_keeps_its_list() {
        let dir = tempfile::tempdir().unwrap();
        let (_meta, listener, addr) = fake_meta(vec![revoked("ann", 1)]).await;
        let cluster = Key::generate().unwrap();
        let first = DataVerifier::new(cluster.clone(), ep(), addr, Some(dir.path()));
        assert_eq!(first.pull(&Weak::new()).await.unwrap(), 1);
        drop((first, listener));
        // Nobody listens at port 1: the metadata server is away.
        let again = DataVerifier::new(cluster, ep(), "127.0.0.1:1".into(), Some(dir.path()));
        assert!(
            again.pull(&Weak::new()).await.is_err(),
            "the metadata server answered"
        );
        let claim = Claim {
            key_id: KeyId([1; 16]),
            caps: proto::auth::Caps::default(),
        };
        let found = again.lookup("ann", Some(&claim)).await;
        assert!(
            matches!(found, Lookup::Refused { why: "revoked", .. }),
            "{found:?}"
        );
    }
}
