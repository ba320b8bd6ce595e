//! The choice of backend, made at run time: `tcp`, `rdma`, `auto` or `mem`.

use crate::config::TransportConfig;
use crate::error::TransportError;
use serde::{Deserialize, Serialize};
use tracing::info;

/// Which wire a transport endpoint uses (`transport = "..."` in every config file, and
/// `--transport` on every binary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// One TCP stream per connection; one-sided operations are served by the peer's
    /// transport engine. Runs everywhere.
    #[default]
    Tcp,
    /// RDMA verbs (InfiniBand or RoCE v2): reliable-connected queue pairs, one-sided
    /// operations done by the NIC. Needs the `rdma` build feature and a device.
    Rdma,
    /// `rdma` when a usable RDMA device exists, otherwise `tcp` (and a log line saying
    /// why).
    Auto,
    /// Peers inside one process, with fault injection ([`crate::mem`]); for tests.
    Mem,
}

/// Every backend, in the order they are offered.
pub const BACKENDS: [Backend; 4] = [Backend::Tcp, Backend::Rdma, Backend::Auto, Backend::Mem];

impl Backend {
    /// The name used in config files and on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Tcp => "tcp",
            Backend::Rdma => "rdma",
            Backend::Auto => "auto",
            Backend::Mem => "mem",
        }
    }

    /// The backend this choice means on this host: `Auto` becomes `Rdma` or `Tcp`
    /// (logging why when it falls back); `Rdma` without a usable device is an
    /// [`TransportError::Unsupported`] error with one sentence that names `tcp`.
    pub fn resolve(self, config: &TransportConfig) -> Result<Backend, TransportError> {
        match self {
            Backend::Tcp | Backend::Mem => Ok(self),
            Backend::Rdma => match rdma_probe(config) {
                Ok(()) => Ok(Backend::Rdma),
                Err(why) => Err(TransportError::Unsupported(format!(
                    "the rdma transport cannot run: {why}; use the tcp transport instead \
                     (--transport tcp, or transport = \"tcp\" in the config file)"
                ))),
            },
            Backend::Auto => match rdma_probe(config) {
                Ok(()) => {
                    info!("transport auto: using rdma");
                    Ok(Backend::Rdma)
                }
                Err(why) => {
                    info!("transport auto: using tcp because {why}");
                    Ok(Backend::Tcp)
                }
            },
        }
    }
}

impl Backend {
    /// The backend a server or client *process* runs on: [`Backend::resolve`], and
    /// `mem` refused, since it connects peers inside one process only (tests).
    pub fn resolve_for_process(self, config: &TransportConfig) -> Result<Backend, TransportError> {
        if self == Backend::Mem {
            return Err(TransportError::Unsupported(
                "the mem transport connects peers inside one process only (for tests); \
                 use the tcp transport (--transport tcp) between processes"
                    .into(),
            ));
        }
        self.resolve(config)
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Backend, String> {
        BACKENDS
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("unknown transport {s:?}: choose tcp, rdma, auto or mem"))
    }
}

/// Why the `rdma` backend cannot run here, or `Ok` if it can.
pub fn rdma_probe(config: &TransportConfig) -> Result<(), String> {
    #[cfg(feature = "rdma")]
    {
        crate::rdma::probe(&config.rdma)
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = config;
        Err("this build has no RDMA support (it was built without the `rdma` feature)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct W {
        transport: Backend,
    }

    #[test]
    fn names_parse_and_serialize_lowercase() {
        for b in BACKENDS {
            assert_eq!(b.name().parse::<Backend>(), Ok(b));
            let text = toml::to_string(&W { transport: b }).unwrap();
            assert_eq!(text.trim(), format!("transport = \"{}\"", b.name()));
            assert_eq!(toml::from_str::<W>(&text).unwrap(), W { transport: b });
        }
        let e = "infiniband".parse::<Backend>().unwrap_err();
        assert!(e.contains("choose tcp, rdma, auto or mem"), "{e}");
        assert!(toml::from_str::<W>("transport = \"RDMA\"").is_err());
    }

    #[test]
    fn tcp_and_mem_resolve_to_themselves() {
        let c = TransportConfig::default();
        assert_eq!(Backend::Tcp.resolve(&c).unwrap(), Backend::Tcp);
        assert_eq!(Backend::Mem.resolve(&c).unwrap(), Backend::Mem);
        let e = Backend::Mem
            .resolve_for_process(&c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("inside one process") && e.contains("tcp"), "{e}");
    }

    /// Guards the promise that a host without RDMA gets one clear sentence naming tcp,
    /// and that `auto` falls back instead of failing.
    #[test]
    fn rdma_without_a_device_names_tcp_and_auto_falls_back() {
        let c = TransportConfig::default();
        if rdma_probe(&c).is_ok() {
            return; // a machine with a working device: nothing to fall back from
        }
        let e = Backend::Rdma.resolve(&c).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, TransportError::Unsupported(_)));
        assert!(msg.contains("tcp transport"), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert_eq!(Backend::Auto.resolve(&c).unwrap(), Backend::Tcp);
    }
}
