//! Grants: what the metadata server lets a client do with one file's chunks, sealed with
//! the cluster key so that data servers can check it without asking.
//!
//! The metadata server seals a [`Grant`] with a file's layout at open and create (and
//! again on `Regrant`); the client attaches it to every chunk request for that file; a
//! data server checks it with [`check`] against the connection's authenticated client
//! name, the chunk's inode and the access the request needs. Sealing and checking are
//! pure functions of their inputs, the clock included.

use crate::ids::InodeId;
use serde::{Deserialize, Serialize};

/// Bytes of a grant's MAC (HMAC-SHA256).
pub const GRANT_MAC_BYTES: usize = crate::mac::MAC_BYTES;

/// How far a data server's clock may be ahead of the metadata server's, unless its
/// configuration says otherwise: a grant is still taken this long after its expiry (and
/// clients renew at half its lifetime, well before).
pub const CLOCK_SKEW_MS: u64 = 30_000;

/// Domain of the MAC: no other MAC made with the cluster key (the handshake's) covers
/// bytes that start this way.
const DOMAIN: &[u8] = b"tessera-grant-1";

/// What a grant allows (and, as a request's need, what it asks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GrantMode {
    /// Reads of the file's chunks.
    Read,
    /// Reads, writes, truncation and fsync of the file's chunks.
    ReadWrite,
    /// Reads, and a truncation of the file to exactly this length (`.0`) with exactly
    /// the file's chunk size (`.1`: which chunks a truncation removes is counted in
    /// it, so another would remove chunks below the length): the cut of what a writer
    /// that vanished left past the committed length, which the next open makes first,
    /// even one for reading (as a need: that truncation).
    CutTo(u64, u32),
}

impl GrantMode {
    /// Whether a grant of this mode allows what `need` asks.
    pub fn allows(self, need: GrantMode) -> bool {
        match (self, need) {
            (GrantMode::ReadWrite, _) => true,
            (GrantMode::Read | GrantMode::CutTo(..), GrantMode::Read) => true,
            (GrantMode::CutTo(len, cs), GrantMode::CutTo(want, want_cs)) => {
                len == want && cs == want_cs
            }
            (GrantMode::Read | GrantMode::CutTo(..), _) => false,
        }
    }

    /// The mode's bytes under the MAC: a kind byte, and a cut's length and chunk size.
    fn bytes(self) -> Vec<u8> {
        match self {
            GrantMode::Read => vec![1],
            GrantMode::ReadWrite => vec![2],
            GrantMode::CutTo(len, cs) => {
                [&[4u8][..], &len.to_be_bytes(), &cs.to_be_bytes()].concat()
            }
        }
    }
}

/// A sealed permission for one client to use one file's chunks until `expires_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Grant {
    /// The file.
    pub inode: InodeId,
    /// The client's key name: only a connection authenticated as it may use the grant.
    pub client: String,
    /// What it allows.
    pub mode: GrantMode,
    /// Unix time in milliseconds (the metadata server's clock) after which it is refused.
    pub expires_ms: u64,
    /// The cluster map version at sealing, recorded for the logs: a map change does not
    /// end a grant (a chain that changes must not fail the files open on it).
    pub map_version: u64,
    /// HMAC-SHA256 of the fields above under the cluster key.
    pub mac: [u8; GRANT_MAC_BYTES],
}

/// Why a chunk request's grant is refused; each has its own wire error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrantFault {
    /// The request carried none.
    Missing,
    /// Its MAC does not match its fields under the cluster key.
    Forged,
    /// Its time is over (beyond [`CLOCK_SKEW_MS`]).
    Expired,
    /// It was given to another client.
    WrongClient,
    /// It is for another file.
    WrongFile,
    /// It allows reads and the request writes.
    WrongMode,
}

impl GrantFault {
    /// Every fault, in a fixed order (for counters).
    pub const ALL: [GrantFault; 6] = [
        GrantFault::Missing,
        GrantFault::Forged,
        GrantFault::Expired,
        GrantFault::WrongClient,
        GrantFault::WrongFile,
        GrantFault::WrongMode,
    ];

    /// A short name for logs and counters.
    pub fn name(self) -> &'static str {
        match self {
            GrantFault::Missing => "missing",
            GrantFault::Forged => "forged",
            GrantFault::Expired => "expired",
            GrantFault::WrongClient => "wrong_client",
            GrantFault::WrongFile => "wrong_file",
            GrantFault::WrongMode => "wrong_mode",
        }
    }

    /// The wire error code it is answered with.
    pub fn code(self) -> crate::ErrorCode {
        use crate::ErrorCode as C;
        match self {
            GrantFault::Missing => C::GrantMissing,
            GrantFault::Forged => C::GrantForged,
            GrantFault::Expired => C::GrantExpired,
            GrantFault::WrongClient => C::GrantWrongClient,
            GrantFault::WrongFile => C::GrantWrongFile,
            GrantFault::WrongMode => C::GrantWrongMode,
        }
    }
}

/// What a chunk request needs of its grant.
#[derive(Clone, Copy, Debug)]
pub struct Need<'a> {
    /// The file the request touches.
    pub inode: InodeId,
    /// The client name its connection authenticated as.
    pub client: &'a str,
    /// The access it asks for.
    pub mode: GrantMode,
}

/// What a data server knows of its metadata server when it checks a grant. A grant
/// that ran out while the metadata server could not be reached is still taken until it
/// can be again: its client could not renew it, and the open files' reads and writes
/// must not stop for an outage longer than a grant's lifetime. Once the metadata
/// server answers, the client renews and the old grant is refused again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaReach {
    /// The last call to the metadata server was answered.
    Reached,
    /// The last call was not answered; the metadata server was last reached at this
    /// unix time in milliseconds (the data server's clock; its start if never).
    LostSince(u64),
}

impl MetaReach {
    /// Whether the outage excuses `g`'s expiry, judged as `skew_ms` late: the metadata
    /// server was last reached before the grant ran out, so its client had no chance
    /// to renew it since. A grant that ran out before the outage began stays refused.
    fn excuses(self, g: &Grant, skew_ms: u64) -> bool {
        match self {
            MetaReach::Reached => false,
            // A cut grant is for the open that asked, now: never stretched.
            MetaReach::LostSince(_) if matches!(g.mode, GrantMode::CutTo(..)) => false,
            MetaReach::LostSince(t) => t <= g.expires_ms.saturating_add(skew_ms),
        }
    }
}

/// The MAC's fields: the domain, then every field of the grant but the MAC.
fn with_fields<T>(g: &Grant, f: impl FnOnce(&[&[u8]]) -> T) -> T {
    let (inode, mode) = (g.inode.0.to_be_bytes(), g.mode.bytes());
    let (expires, version) = (g.expires_ms.to_be_bytes(), g.map_version.to_be_bytes());
    f(&[
        DOMAIN,
        &inode,
        g.client.as_bytes(),
        &mode,
        &expires,
        &version,
    ])
}

/// Seals a grant of `mode` on `inode` for `client` until `expires_ms` under `key` (the
/// cluster key).
pub fn seal(
    key: &[u8],
    inode: InodeId,
    client: &str,
    mode: GrantMode,
    expires_ms: u64,
    map_version: u64,
) -> Grant {
    let mut g = Grant {
        inode,
        client: client.to_string(),
        mode,
        expires_ms,
        map_version,
        mac: [0; GRANT_MAC_BYTES],
    };
    g.mac = with_fields(&g, |fields| crate::mac::tag(key, fields));
    g
}

/// Whether `g`'s MAC is right under `key`, compared in constant time.
pub fn sealed_by(key: &[u8], g: &Grant) -> bool {
    with_fields(g, |fields| crate::mac::tag_ok(key, fields, &g.mac))
}

/// Checks everything but the MAC: the cheap comparisons made on every request, at
/// `now_ms` with a clock margin of `skew_ms`, an expiry excused by an outage of the
/// metadata server as `reach` says.
pub fn check_fields(
    g: &Grant,
    need: Need<'_>,
    now_ms: u64,
    skew_ms: u64,
    reach: MetaReach,
) -> Result<(), GrantFault> {
    if g.client != need.client {
        return Err(GrantFault::WrongClient);
    }
    if g.inode != need.inode {
        return Err(GrantFault::WrongFile);
    }
    if !g.mode.allows(need.mode) {
        return Err(GrantFault::WrongMode);
    }
    if now_ms > g.expires_ms.saturating_add(skew_ms) && !reach.excuses(g, skew_ms) {
        return Err(GrantFault::Expired);
    }
    Ok(())
}

/// Checks a request's grant: present, sealed under `key`, and fit for `need` at
/// `now_ms` (unix milliseconds) with the default clock margin ([`CLOCK_SKEW_MS`]).
pub fn check(key: &[u8], g: Option<&Grant>, need: Need<'_>, now_ms: u64) -> Result<(), GrantFault> {
    let g = g.ok_or(GrantFault::Missing)?;
    if !sealed_by(key, g) {
        return Err(GrantFault::Forged);
    }
    check_fields(g, need, now_ms, CLOCK_SKEW_MS, MetaReach::Reached)
}

/// The current unix time in milliseconds (the clock grants are made and checked by).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const NOW: u64 = 1_000_000;

    fn need(mode: GrantMode) -> Need<'static> {
        Need {
            inode: InodeId(5),
            client: "alice",
            mode,
        }
    }

    fn good() -> Grant {
        seal(
            &KEY,
            InodeId(5),
            "alice",
            GrantMode::ReadWrite,
            NOW + 1000,
            3,
        )
    }

    #[test]
    fn a_sealed_grant_is_taken_for_what_it_allows() {
        let g = good();
        assert_eq!(
            check(&KEY, Some(&g), need(GrantMode::ReadWrite), NOW),
            Ok(())
        );
        assert_eq!(check(&KEY, Some(&g), need(GrantMode::Read), NOW), Ok(()));
        let r = seal(&KEY, InodeId(5), "alice", GrantMode::Read, NOW + 1000, 3);
        assert_eq!(check(&KEY, Some(&r), need(GrantMode::Read), NOW), Ok(()));
        assert_eq!(
            check(&KEY, Some(&r), need(GrantMode::ReadWrite), NOW),
            Err(GrantFault::WrongMode)
        );
        assert_eq!(
            check(&KEY, None, need(GrantMode::Read), NOW),
            Err(GrantFault::Missing)
        );
    }

    /// Guards against the cut of a vanished writer's tail needing a writable grant (a
    /// reader could write the file with it): a cut grant allows reads and a truncation
    /// to its own length only, and its length is under the MAC.
    #[test]
    fn a_cut_grant_allows_reads_and_its_own_truncation_only() {
        let cut = seal(
            &KEY,
            InodeId(5),
            "alice",
            GrantMode::CutTo(10, 4096),
            NOW + 1000,
            3,
        );
        let at = |mode| check(&KEY, Some(&cut), need(mode), NOW);
        assert_eq!(at(GrantMode::Read), Ok(()));
        assert_eq!(at(GrantMode::CutTo(10, 4096)), Ok(()));
        assert_eq!(at(GrantMode::CutTo(0, 4096)), Err(GrantFault::WrongMode));
        // Counted in larger chunks, a cut to the same length removes chunks below it.
        assert_eq!(at(GrantMode::CutTo(10, 65536)), Err(GrantFault::WrongMode));
        assert_eq!(at(GrantMode::ReadWrite), Err(GrantFault::WrongMode));
        let read = seal(&KEY, InodeId(5), "alice", GrantMode::Read, NOW + 1000, 3);
        let cut_with = |g: &Grant| check(&KEY, Some(g), need(GrantMode::CutTo(10, 4096)), NOW);
        assert_eq!(cut_with(&read), Err(GrantFault::WrongMode));
        assert_eq!(cut_with(&good()), Ok(()), "a writable grant cuts anywhere");
        let mut longer = cut.clone();
        longer.mode = GrantMode::CutTo(0, 4096);
        assert!(!sealed_by(&KEY, &longer), "the length is sealed");
        let coarser = GrantMode::CutTo(10, 65536);
        assert!(
            !sealed_by(
                &KEY,
                &Grant {
                    mode: coarser,
                    ..cut
                }
            ),
            "so is the chunk size"
        );
    }

    #[test]
    fn every_changed_field_makes_a_forgery() {
        let g = good();
        let forged: [fn(&mut Grant); 6] = [
            |g| g.inode = InodeId(6),
            |g| g.client = "mallory".into(),
            |g| g.mode = GrantMode::Read,
            |g| g.expires_ms += 1,
            |g| g.map_version += 1,
            |g| g.mac[0] ^= 1,
        ];
        for change in forged {
            let mut f = g.clone();
            change(&mut f);
            assert!(!sealed_by(&KEY, &f), "{f:?}");
        }
        // Upgrading a read grant by hand is a forgery, not a pass.
        let mut up = seal(&KEY, InodeId(5), "alice", GrantMode::Read, NOW + 1000, 3);
        up.mode = GrantMode::ReadWrite;
        assert_eq!(
            check(&KEY, Some(&up), need(GrantMode::ReadWrite), NOW),
            Err(GrantFault::Forged)
        );
        assert_eq!(
            check(&[8; 32], Some(&g), need(GrantMode::Read), NOW),
            Err(GrantFault::Forged)
        );
    }

    #[test]
    fn expiry_client_and_file_are_checked_with_the_skew_margin() {
        let g = good();
        let late = g.expires_ms + CLOCK_SKEW_MS;
        assert_eq!(check(&KEY, Some(&g), need(GrantMode::Read), late), Ok(()));
        assert_eq!(
            check(&KEY, Some(&g), need(GrantMode::Read), late + 1),
            Err(GrantFault::Expired)
        );
        let bob = Need {
            client: "bob",
            ..need(GrantMode::Read)
        };
        assert_eq!(
            check(&KEY, Some(&g), bob, NOW),
            Err(GrantFault::WrongClient)
        );
        let other = Need {
            inode: InodeId(6),
            ..need(GrantMode::Read)
        };
        assert_eq!(
            check(&KEY, Some(&g), other, NOW),
            Err(GrantFault::WrongFile)
        );
    }

    /// Guards against reads and writes of open files stopping during a metadata server
    /// outage longer than a grant's lifetime: a grant that ran out while the metadata
    /// server was away is taken until it answers again, one that ran out before is not.
    #[test]
    fn an_outage_excuses_an_expiry_that_fell_within_it() {
        let g = good();
        let late = g.expires_ms + CLOCK_SKEW_MS + 60_000;
        let at = |reach| check_fields(&g, need(GrantMode::ReadWrite), late, CLOCK_SKEW_MS, reach);
        assert_eq!(at(MetaReach::Reached), Err(GrantFault::Expired));
        assert_eq!(
            at(MetaReach::LostSince(NOW)),
            Ok(()),
            "lost before it ran out"
        );
        let after = g.expires_ms + CLOCK_SKEW_MS + 1;
        assert_eq!(
            at(MetaReach::LostSince(after)),
            Err(GrantFault::Expired),
            "ran out while the metadata server was there to renew it"
        );
        // Every other check still holds during an outage.
        let bob = Need {
            client: "bob",
            ..need(GrantMode::Read)
        };
        let lost = MetaReach::LostSince(NOW);
        assert_eq!(
            check_fields(&g, bob, late, CLOCK_SKEW_MS, lost),
            Err(GrantFault::WrongClient)
        );
    }

    #[test]
    fn faults_have_distinct_codes() {
        let codes: std::collections::HashSet<_> =
            GrantFault::ALL.iter().map(|f| f.code()).collect();
        assert_eq!(codes.len(), GrantFault::ALL.len());
    }
}
