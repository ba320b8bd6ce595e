//! What the metrics read of the namespace at a scrape: counts kept in memory anyway,
//! read under their locks once per scrape, never on a request's path.

use super::Namespace;
use crate::kv::GroupObserver;

/// The namespace's in-memory counts at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Open-file sessions (of every connection, detached ones included).
    pub open_sessions: usize,
    /// Distinct files open.
    pub open_files: usize,
    /// Byte-range locks held.
    pub locks_held: usize,
    /// Broken connections whose sessions wait for their client to resume.
    pub waiting_resume: usize,
}

impl Namespace {
    /// The in-memory counts, for the metrics.
    pub fn gauges(&self) -> Gauges {
        let locks_held = self.locks.lock().held();
        let st = self.state.lock();
        Gauges {
            open_sessions: st.sessions.len(),
            open_files: st.open_counts.values().filter(|&&n| n > 0).count(),
            locks_held,
            waiting_resume: st.detached.len(),
        }
    }

    /// Tells `observer` of every group the group commit makes durable.
    pub fn observe_commits(&self, observer: GroupObserver) {
        self.group.observe(observer);
    }
}
