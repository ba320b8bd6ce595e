//! Whom a metadata call is made for: every file-system call names its caller (uid,
//! gid, supplementary groups), and the metadata server checks permissions for it.
//!
//! The FUSE layer runs each kernel request's task inside [`acting_as`] with the
//! caller of that request; every call the task makes names it (so does a data path
//! call's `Regrant` that a fetch or a flush's send makes in its first poll, inside the
//! request: the server judges a regrant by its session). Calls made outside such a
//! task (a library user, the client's own background work: write-behind commits,
//! batched releases, atime reports) name this process's own credentials,
//! which is what a local call of the process would be judged as. The server judges
//! commits, appends and releases by the open session, not by the caller's mode bits.

use proto::meta::Caller;
use std::future::Future;
use std::sync::OnceLock;

tokio::task_local! {
    static CALLER: Caller;
}

/// Runs `f` with every metadata call it makes named for `caller`.
pub async fn acting_as<F: Future>(caller: Caller, f: F) -> F::Output {
    CALLER.scope(caller, f).await
}

/// The caller of the current task's request, or this process's own credentials.
pub(crate) fn current() -> Caller {
    CALLER
        .try_with(Caller::clone)
        .unwrap_or_else(|_| process().clone())
}

/// This process's effective uid and gid and its supplementary groups, read once.
fn process() -> &'static Caller {
    static ME: OnceLock<Caller> = OnceLock::new();
    ME.get_or_init(|| {
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let mut groups = vec![0 as libc::gid_t; proto::meta::MAX_GROUPS];
        // SAFETY: the buffer holds `MAX_GROUPS` entries, the length passed; a process
        // with more groups gets -1 (EINVAL) and is named with its gid alone.
        let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
        groups.truncate(usize::try_from(n).unwrap_or(0));
        Caller::with_groups(uid, gid, groups)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_acting_for_a_caller_names_it_and_others_name_the_process() {
        let who = Caller::with_groups(1234, 56, [7]);
        let seen = acting_as(who.clone(), async { current() }).await;
        assert_eq!(seen, who);
        // SAFETY: no preconditions.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(current().uid, uid, "outside a request: this process");
    }
}
