//! `mount -o remount,...` of a Tessera mount: what the kernel keeps per mount (read-only,
//! `nosuid`, `nodev`, `noexec`) changes in place, with no new mount process.
//!
//! `mount(8)` runs the helper for a remount too, with the mount's current options from
//! the mount table followed by the ones asked for (`rw,nosuid,...,remount,ro`). FUSE
//! takes no file-system options on a remount (the kernel ignores them through
//! `mount(2)`), and the mount process's own settings (keys, caches, its access-time
//! mode) are fixed for its life, so only the kernel's flags are read from the list; the
//! last of `ro`/`rw` (and of each other pair) wins, as with any mount.

use super::mount_helper::each_option;
use anyhow::Context;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The kernel's flags a remount keeps or changes, by their `mount(2)` names.
const PAIRS: &[(&str, &str, libc::c_ulong)] = &[
    ("ro", "rw", libc::MS_RDONLY),
    ("nosuid", "suid", libc::MS_NOSUID),
    ("nodev", "dev", libc::MS_NODEV),
    ("noexec", "exec", libc::MS_NOEXEC),
];

/// Whether the option lists ask for a remount.
pub fn is_remount(lists: &[String]) -> bool {
    each_option(lists).any(|o| o == "remount")
}

/// The flags for `mount(2)`, from `lists` alone: `mount(8)` passes the mount's whole
/// state (the mount table's options, with those asked for merged in: asking for `dev`
/// takes `nodev` out of the list), and a remount through `mount(2)` sets exactly the
/// flags it is given, as here. The access time stays the kernel's `noatime` the mount
/// was made with: the mount process keeps access times itself.
pub fn remount_flags(lists: &[String]) -> libc::c_ulong {
    let mut flags = 0;
    for o in each_option(lists) {
        for &(set, clear, bit) in PAIRS {
            if o == set {
                flags |= bit;
            } else if o == clear {
                flags &= !bit;
            }
        }
    }
    flags | libc::MS_REMOUNT | libc::MS_NOATIME
}

/// Remounts `mountpoint` with the flags `lists` asks for.
pub fn remount(mountpoint: &Path, lists: &[String]) -> anyhow::Result<()> {
    let path = CString::new(mountpoint.as_os_str().as_bytes())
        .with_context(|| format!("mount point {}", mountpoint.display()))?;
    let flags = remount_flags(lists);
    // SAFETY: NUL-terminated target; no source, type or data (a remount of FUSE takes
    // none through `mount(2)`), which the kernel reads as absent.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(e).with_context(|| format!("remount of {}", mountpoint.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lists(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_remount_sets_the_flags_of_the_whole_list_mount_passes() {
        let base = libc::MS_REMOUNT | libc::MS_NOATIME;
        // `mount -o remount,ro` of a nosuid,nodev mount: the table's options, then ro.
        let ro = lists(&["rw,nosuid,nodev,noatime,user_id=0,allow_other,remount,ro"]);
        assert!(is_remount(&ro));
        assert_eq!(
            remount_flags(&ro),
            base | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV
        );
        // `mount -o remount,dev,exec` of it: mount(8) leaves nodev out of the list.
        let dev = lists(&["rw,nosuid,noatime,remount,user_id=0,allow_other"]);
        assert_eq!(remount_flags(&dev), base | libc::MS_NOSUID);
        // The last of a pair wins.
        let back = lists(&["ro,noexec", "remount,rw,exec,nodev"]);
        assert_eq!(remount_flags(&back), base | libc::MS_NODEV);
        assert!(!is_remount(&lists(&["ro,nosuid"])));
    }
}
