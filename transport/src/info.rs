//! `tessera transport-info`: what RDMA this host has and what `auto` would pick.

use crate::backend::rdma_probe;
use crate::config::{RdmaConfig, TransportConfig};
use crate::rdma_common::conn_data::LinkLayer;
use crate::rdma_common::sysfs::{self, GidType, SYSFS_ROOT};
use std::fmt::Write;
use std::path::Path;

/// The report for this host and configuration.
pub fn report(config: &TransportConfig) -> String {
    report_from(Path::new(SYSFS_ROOT), &config.rdma, rdma_probe(config))
}

/// The report from the sysfs tree at `root`, given whether the verbs layer works
/// (`probe`, as [`rdma_probe`] answers).
pub fn report_from(root: &Path, config: &RdmaConfig, probe: Result<(), String>) -> String {
    let mut out = String::new();
    let devices = sysfs::scan(root);
    let _ = writeln!(out, "RDMA devices (from {}):", root.display());
    if devices.is_empty() {
        let why = if root.exists() {
            "the directory is empty".to_string()
        } else {
            format!(
                "{} does not exist: the kernel has no RDMA support loaded",
                root.display()
            )
        };
        let _ = writeln!(out, "  none ({why})");
    }
    for d in &devices {
        if d.ports.is_empty() {
            let _ = writeln!(out, "  {}: no ports", d.name);
        }
        for p in &d.ports {
            let link = match p.link {
                LinkLayer::InfiniBand => format!("InfiniBand, lid {:#x}", p.lid),
                LinkLayer::Ethernet => "Ethernet (RoCE)".to_string(),
            };
            let _ = writeln!(out, "  {} port {}: {}, {link}", d.name, p.num, p.state);
            for g in &p.gids {
                let kind = match g.kind {
                    GidType::RoceV2 => "RoCE v2",
                    GidType::IbRoceV1 => "IB/RoCE v1",
                    GidType::Other => "unknown type",
                };
                let dev = g.netdev.as_deref().unwrap_or("-");
                let _ = writeln!(
                    out,
                    "    gid {:>3}  {}  {kind:<10}  {dev}",
                    g.index,
                    g.text()
                );
            }
        }
    }
    let picked = sysfs::pick(&devices, &config.device, config.port, config.gid_index);
    match &picked {
        Ok((d, p, Some(g))) => {
            let _ = writeln!(out, "selected: {} port {} gid index {g}", d.name, p.num);
        }
        Ok((d, p, None)) => {
            let _ = writeln!(out, "selected: {} port {} (by LID)", d.name, p.num);
        }
        Err(e) => {
            let _ = writeln!(out, "selected: nothing ({e})");
        }
    }
    match &probe {
        Ok(()) => {
            let _ = writeln!(out, "verbs: usable");
        }
        Err(why) => {
            let _ = writeln!(out, "verbs: unusable: {why}");
        }
    }
    let _ = match probe {
        Ok(()) => writeln!(out, "transport = \"auto\" would use: rdma"),
        Err(why) => writeln!(out, "transport = \"auto\" would use: tcp, because {why}"),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_without_rdma_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("infiniband");
        let r = report_from(&missing, &RdmaConfig::default(), Err("no device".into()));
        assert!(r.contains("none ("), "{r}");
        assert!(r.contains("kernel has no RDMA support"), "{r}");
        assert!(r.contains("would use: tcp, because no device"), "{r}");
    }

    #[test]
    fn devices_ports_and_gids_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rxe0/ports/1");
        std::fs::create_dir_all(p.join("gids")).unwrap();
        std::fs::create_dir_all(p.join("gid_attrs/types")).unwrap();
        std::fs::write(p.join("link_layer"), "Ethernet").unwrap();
        std::fs::write(p.join("state"), "4: ACTIVE").unwrap();
        std::fs::write(p.join("gids/1"), "fe80:0000:0000:0000:5054:00ff:fe12:3456").unwrap();
        std::fs::write(p.join("gid_attrs/types/1"), "RoCE v2").unwrap();
        let r = report_from(dir.path(), &RdmaConfig::default(), Ok(()));
        assert!(r.contains("rxe0 port 1: 4: ACTIVE, Ethernet (RoCE)"), "{r}");
        assert!(
            r.contains("fe80:0000:0000:0000:5054:00ff:fe12:3456  RoCE v2"),
            "{r}"
        );
        assert!(r.contains("selected: rxe0 port 1 gid index 1"), "{r}");
        assert!(r.contains("would use: rdma"), "{r}");
    }
}
