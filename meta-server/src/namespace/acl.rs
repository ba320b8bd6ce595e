//! POSIX access control lists (`system.posix_acl_access`, `system.posix_acl_default`):
//! their stored form and the rules Linux applies to them (`fs/posix_acl.c`), as pure
//! functions of the list, the mode and the caller.
//!
//! A list is kept as the extended attribute the kernel exchanges with a file system
//! (`posix_acl_xattr_header`, version 2, then entries of tag, permission and id, little
//! endian), so a mount's `getxattr` is answered with the stored bytes. The metadata
//! server applies the rules itself, for clients that have no kernel (the library) as
//! for mounts: the access check of a named user or group, the mode a list sets, a
//! `chmod`'s change of the list, and a new inode's lists from its directory's default.

use crate::error::MetaError;
use proto::meta::Caller;

/// The attribute holding a file's access list.
pub const ACCESS: &[u8] = proto::ACL_ACCESS_XATTR;
/// The attribute holding a directory's default list, given to what is made in it.
pub const DEFAULT: &[u8] = proto::ACL_DEFAULT_XATTR;

/// The only version of the attribute's format.
const VERSION: u32 = 2;
/// Entries a list may hold: what fits the page a FUSE kernel reads an ACL into
/// (`fuse_get_acl`); a longer one would fail every access check on a mount (E2BIG).
/// ext4's own limit is about the same (one 4 KiB block).
pub const MAX_ENTRIES: usize = (4096 - 4) / 8;
/// No id: the entries of the owner, the group, the mask and others carry this one,
/// and no named entry may (the kernel maps no user or group to it).
const NO_ID: u32 = u32::MAX;

/// What an entry is about, in the order a valid list holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    /// The owner (the mode's user bits).
    UserObj,
    /// A named user.
    User(u32),
    /// The owning group (the mode's group bits when there is no mask).
    GroupObj,
    /// A named group.
    Group(u32),
    /// The most any named entry or the owning group grants (the mode's group bits).
    Mask,
    /// Everyone else (the mode's other bits).
    Other,
}

/// One entry: whom it is about and its `rwx` bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Whom it is about.
    pub tag: Tag,
    /// Its `rwx` bits.
    pub perm: u32,
}

/// A valid list (as `posix_acl_valid` has it): one owner, named users, the owning
/// group, named groups, a mask if there is any named entry, others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

fn invalid(why: &str) -> MetaError {
    MetaError::InvalidArgument(format!("POSIX ACL: {why}"))
}

impl Acl {
    /// Parses and checks the attribute's bytes; `None` for a list of no entries, which
    /// removes the ACL (`posix_acl_from_xattr`).
    pub fn parse(bytes: &[u8]) -> Result<Option<Acl>, MetaError> {
        let (head, body) = bytes
            .split_first_chunk::<4>()
            .ok_or_else(|| invalid("shorter than its header"))?;
        if u32::from_le_bytes(*head) != VERSION {
            return Err(MetaError::NotSupported(
                "POSIX ACL: not version 2 of the format".into(),
            ));
        }
        if body.len() % 8 != 0 {
            return Err(invalid("a partial entry"));
        }
        if body.is_empty() {
            return Ok(None);
        }
        if body.len() / 8 > MAX_ENTRIES {
            return Err(MetaError::TooBig(format!(
                "POSIX ACL of {} entries, the limit is {MAX_ENTRIES}",
                body.len() / 8
            )));
        }
        let entries = body
            .chunks_exact(8)
            .map(|e| {
                let tag = u16::from_le_bytes([e[0], e[1]]);
                let perm = u32::from(u16::from_le_bytes([e[2], e[3]]));
                let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
                let named = |id: u32| match id {
                    NO_ID => Err(invalid("a named entry without an id")),
                    id => Ok(id),
                };
                let tag = match tag {
                    0x01 => Tag::UserObj,
                    0x02 => Tag::User(named(id)?),
                    0x04 => Tag::GroupObj,
                    0x08 => Tag::Group(named(id)?),
                    0x10 => Tag::Mask,
                    0x20 => Tag::Other,
                    t => return Err(invalid(&format!("unknown tag {t:#x}"))),
                };
                if perm & !7 != 0 {
                    return Err(invalid(&format!("permission bits {perm:#o}")));
                }
                Ok(Entry { tag, perm })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let acl = Acl { entries };
        acl.check()?;
        Ok(Some(acl))
    }

    /// The attribute's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            let (tag, id) = match e.tag {
                Tag::UserObj => (0x01u16, NO_ID),
                Tag::User(id) => (0x02, id),
                Tag::GroupObj => (0x04, NO_ID),
                Tag::Group(id) => (0x08, id),
                Tag::Mask => (0x10, NO_ID),
                Tag::Other => (0x20, NO_ID),
            };
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&(e.perm as u16).to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// The order and the entries a list must have (`posix_acl_valid`): the owner, named
    /// users, the owning group, named groups, the mask, others; one of each but the
    /// named ones, whose order among themselves is free (`setfacl` sorts them; a raw
    /// `setfattr` need not, and the kernel takes that).
    fn check(&self) -> Result<(), MetaError> {
        let rank = |t: &Tag| -> u8 {
            match t {
                Tag::UserObj => 0,
                Tag::User(_) => 1,
                Tag::GroupObj => 2,
                Tag::Group(_) => 3,
                Tag::Mask => 4,
                Tag::Other => 5,
            }
        };
        let once = |r: u8| matches!(r, 0 | 2 | 4 | 5);
        let ordered = self.entries.windows(2).all(|w| {
            let (a, b) = (rank(&w[0].tag), rank(&w[1].tag));
            a < b || (a == b && !once(a))
        });
        if !ordered {
            return Err(invalid("entries out of order or repeated"));
        }
        let has = |r: u8| self.entries.iter().any(|e| rank(&e.tag) == r);
        if !(has(0) && has(2) && has(5)) {
            return Err(invalid("no owner, owning group or others entry"));
        }
        if (has(1) || has(3)) && !has(4) {
            return Err(invalid("named entries without a mask"));
        }
        Ok(())
    }

    fn find(&self, tag: Tag) -> Option<&Entry> {
        self.entries.iter().find(|e| e.tag == tag)
    }

    fn find_mut(&mut self, tag: Tag) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.tag == tag)
    }

    /// Whether `c`, not the owner, has every access in `want` (`rwx` bits) to a file of
    /// group `gid` by this list (`posix_acl_permission`): a named user's entry limited
    /// by the mask; else any group entry of a group `c` is in (the owning group's or a
    /// named one) that grants all of `want`, limited by the mask; else, in none of
    /// them, the others' entry. Root's override is the caller's to apply.
    pub fn permits(&self, c: &Caller, gid: u32, want: u32) -> bool {
        let mask = self.find(Tag::Mask).map_or(7, |e| e.perm);
        let mut in_a_group = false;
        for e in &self.entries {
            match e.tag {
                Tag::User(uid) if uid == c.uid => return e.perm & mask & want == want,
                Tag::GroupObj if c.in_group(gid) => in_a_group = true,
                Tag::Group(g) if c.in_group(g) => in_a_group = true,
                _ => continue,
            }
            if e.perm & want == want {
                return e.perm & mask & want == want;
            }
        }
        !in_a_group && self.find(Tag::Other).is_some_and(|e| e.perm & want == want)
    }

    /// The mode's permission bits this list stands for (`posix_acl_equiv_mode`): the
    /// owner's, the mask's (or the owning group's) and the others' entries, with the
    /// special bits of `perm` kept; and whether the list says more than those bits
    /// (named entries or a mask), so that it needs storing.
    pub fn mode(&self, perm: u32) -> (u32, bool) {
        let bits = |t: Tag| self.find(t).map_or(0, |e| e.perm);
        let group = self.find(Tag::Mask).map_or(bits(Tag::GroupObj), |m| m.perm);
        let mode = (perm & 0o7000) | bits(Tag::UserObj) << 6 | group << 3 | bits(Tag::Other);
        (mode, self.extended())
    }

    fn extended(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.tag, Tag::User(_) | Tag::Group(_) | Tag::Mask))
    }

    /// A `chmod` to `perm` (`posix_acl_chmod`): the owner's, the mask's (or the owning
    /// group's) and the others' entries take the new bits.
    pub fn chmod(&mut self, perm: u32) {
        if let Some(e) = self.find_mut(Tag::UserObj) {
            e.perm = (perm >> 6) & 7;
        }
        let group = if self.find(Tag::Mask).is_some() {
            Tag::Mask
        } else {
            Tag::GroupObj
        };
        if let Some(e) = self.find_mut(group) {
            e.perm = (perm >> 3) & 7;
        }
        if let Some(e) = self.find_mut(Tag::Other) {
            e.perm = perm & 7;
        }
    }

    /// The access list a new inode made with mode bits `perm` gets from its directory's
    /// default list `self` (`posix_acl_create_masq`): the default's entries limited by
    /// the bits asked for, and the inode's mode limited by the list. `None` when the
    /// result says no more than the mode.
    pub fn create(&self, perm: u32) -> (u32, Option<Acl>) {
        let mut acl = self.clone();
        let mut mode = perm & 0o777;
        for e in &mut acl.entries {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= (mode >> 6) & 7;
                    mode &= (e.perm << 6) | 0o077;
                }
                Tag::Other => {
                    e.perm &= mode & 7;
                    mode &= e.perm | 0o770;
                }
                _ => {}
            }
        }
        let group = if acl.find(Tag::Mask).is_some() {
            Tag::Mask
        } else {
            Tag::GroupObj
        };
        if let Some(e) = acl.find_mut(group) {
            e.perm &= (mode >> 3) & 7;
            mode &= (e.perm << 3) | 0o707;
        }
        let mode = (perm & 0o7000) | mode;
        let extended = acl.extended();
        (mode, extended.then_some(acl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(Tag, u32)]) -> Acl {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, perm)| Entry { tag, perm })
                .collect(),
        }
    }

    fn named() -> Acl {
        acl(&[
            (Tag::UserObj, 7),
            (Tag::User(1001), 6),
            (Tag::GroupObj, 5),
            (Tag::Group(2002), 7),
            (Tag::Mask, 6),
            (Tag::Other, 0),
        ])
    }

    #[test]
    fn the_attribute_bytes_round_trip_as_setfacl_writes_them() {
        // `setfacl -m u:1001:rw- f` on ext4 with mode 0640, read back with getfattr.
        let bytes = [
            2, 0, 0, 0, 1, 0, 6, 0, 255, 255, 255, 255, 2, 0, 6, 0, 233, 3, 0, 0, 4, 0, 4, 0, 255,
            255, 255, 255, 16, 0, 6, 0, 255, 255, 255, 255, 32, 0, 0, 0, 255, 255, 255, 255,
        ];
        let a = Acl::parse(&bytes).unwrap().unwrap();
        assert_eq!(a.find(Tag::User(1001)).unwrap().perm, 6);
        assert_eq!(a.to_bytes(), bytes);
        assert_eq!(a.mode(0), (0o660, true));
    }

    #[test]
    fn malformed_lists_are_refused() {
        let good = named().to_bytes();
        assert!(Acl::parse(&good).unwrap().is_some());
        assert_eq!(
            Acl::parse(&good[..4]).unwrap(),
            None,
            "no entries: a removal"
        );
        let mut bad_version = good.clone();
        bad_version[0] = 1;
        assert!(matches!(
            Acl::parse(&bad_version),
            Err(MetaError::NotSupported(_))
        ));
        let many = acl(&vec![(Tag::UserObj, 7); MAX_ENTRIES + 1]).to_bytes();
        assert!(matches!(Acl::parse(&many), Err(MetaError::TooBig(_))));
        // Named entries in any order, even twice, as the kernel takes them.
        let unsorted = acl(&[
            (Tag::UserObj, 7),
            (Tag::User(9), 7),
            (Tag::User(5), 1),
            (Tag::User(9), 1),
            (Tag::GroupObj, 5),
            (Tag::Mask, 7),
            (Tag::Other, 0),
        ]);
        assert_eq!(Acl::parse(&unsorted.to_bytes()).unwrap(), Some(unsorted));
        let partial = &good[..good.len() - 3];
        let mut unknown_tag = good.clone();
        unknown_tag[4] = 0x40;
        let mut big_perm = good.clone();
        big_perm[6] = 8;
        let out_of_order = acl(&[(Tag::GroupObj, 5), (Tag::UserObj, 7), (Tag::Other, 0)]);
        let repeated = acl(&[
            (Tag::UserObj, 7),
            (Tag::GroupObj, 5),
            (Tag::GroupObj, 5),
            (Tag::Other, 0),
        ]);
        let no_id = acl(&[
            (Tag::UserObj, 7),
            (Tag::User(NO_ID), 7),
            (Tag::GroupObj, 5),
            (Tag::Mask, 7),
            (Tag::Other, 0),
        ]);
        let no_mask = acl(&[
            (Tag::UserObj, 7),
            (Tag::User(5), 7),
            (Tag::GroupObj, 5),
            (Tag::Other, 0),
        ]);
        let no_other = acl(&[(Tag::UserObj, 7), (Tag::GroupObj, 5)]);
        for bytes in [
            &no_id.to_bytes()[..],
            partial,
            &unknown_tag,
            &big_perm,
            &[2, 0],
            &out_of_order.to_bytes(),
            &repeated.to_bytes(),
            &no_mask.to_bytes(),
            &no_other.to_bytes(),
        ] {
            assert!(
                matches!(Acl::parse(bytes), Err(MetaError::InvalidArgument(_))),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn named_entries_are_limited_by_the_mask_and_a_group_member_never_falls_to_others() {
        let a = named();
        let user = Caller::with_groups(1001, 100, []);
        assert!(a.permits(&user, 50, 6) && !a.permits(&user, 50, 1));
        // Group 2002's entry grants rwx, the mask takes x away.
        let member = Caller::with_groups(3000, 3000, [2002]);
        assert!(a.permits(&member, 50, 6) && !a.permits(&member, 50, 1));
        // The owning group's r-x: read yes, write no (its entry lacks it); others'
        // entry is not consulted for a member.
        let owning = Caller::with_groups(3001, 50, []);
        assert!(a.permits(&owning, 50, 4) && !a.permits(&owning, 50, 2));
        let stranger = Caller::with_groups(3002, 3002, []);
        assert!(!a.permits(&stranger, 50, 4));
        let open = acl(&[(Tag::UserObj, 7), (Tag::GroupObj, 0), (Tag::Other, 4)]);
        assert!(open.permits(&stranger, 50, 4));
        assert!(!open.permits(&owning, 50, 4), "the owning group's 0 holds");
    }

    #[test]
    fn a_chmod_changes_the_mask_not_the_owning_groups_entry() {
        let mut a = named();
        a.chmod(0o751);
        assert_eq!(a.mode(0), (0o751, true));
        assert_eq!(a.find(Tag::GroupObj).unwrap().perm, 5);
        let mut plain = acl(&[(Tag::UserObj, 7), (Tag::GroupObj, 5), (Tag::Other, 5)]);
        plain.chmod(0o640);
        assert_eq!(plain.mode(0o2000), (0o2640, false));
    }

    #[test]
    fn a_new_inode_takes_the_default_limited_by_the_mode_asked_for() {
        // A directory's default: u::rwx,u:1001:rwx,g::r-x,m::rwx,o::r-x; open(0666).
        let default = acl(&[
            (Tag::UserObj, 7),
            (Tag::User(1001), 7),
            (Tag::GroupObj, 5),
            (Tag::Mask, 7),
            (Tag::Other, 5),
        ]);
        let (mode, access) = default.create(0o666);
        assert_eq!(mode, 0o664);
        let access = access.unwrap();
        assert_eq!(access.find(Tag::Mask).unwrap().perm, 6);
        assert_eq!(access.find(Tag::User(1001)).unwrap().perm, 7);
        assert_eq!(access.mode(0), (0o664, true));
        // A default without named entries or a mask gives the mode only.
        let minimal = acl(&[(Tag::UserObj, 7), (Tag::GroupObj, 0), (Tag::Other, 0)]);
        assert_eq!(minimal.create(0o2777), (0o2700, None));
    }
}
