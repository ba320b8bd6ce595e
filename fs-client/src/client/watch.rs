//! What the metrics read from the client at each scrape: its connections and how often
//! the metadata connection was made again.

use super::Client;
use crate::error::{ClientError, Result};
use crate::metrics::LinkCounts;
use std::sync::Arc;

impl Client {
    /// Shows this client's connections and metadata reconnects in its metrics.
    pub(super) fn watch_links(self: &Arc<Client>) -> Result<()> {
        let me = Arc::downgrade(self);
        let counts = move || {
            me.upgrade().map(|c| LinkCounts {
                meta_open: c.meta.is_open(),
                data_open: c.data.open_connections(),
                meta_made: c.meta.made(),
            })
        };
        let transport = self.ep.backend().name();
        let watched = self.metrics().watch_links(transport, counts);
        watched.map_err(|e| ClientError::Config(e.to_string()))
    }
}
