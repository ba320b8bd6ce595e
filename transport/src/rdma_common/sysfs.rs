//! RDMA devices as the kernel shows them under `/sys/class/infiniband`: ports, their
//! state and link layer, LIDs, and GIDs with their types (`gid_attrs/types`). This is
//! where `rdma-core` itself learns which GID is RoCE v2, and it needs no verbs call, so
//! `tessera transport-info` works in every build. The root is a parameter so tests use
//! a fake tree.

use super::conn_data::LinkLayer;
use std::path::{Path, PathBuf};

/// Where the kernel lists RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";
/// Most devices, ports and GIDs read (a bound on what a broken sysfs can make us do).
const MAX_ENTRIES: usize = 1024;

/// The type of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand, or RoCE v1 (same table entry type).
    IbRoceV1,
    /// RoCE v2 (routable, UDP).
    RoceV2,
    /// A type this code does not know.
    Other,
}

/// One GID table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gid {
    /// Index in the port's table.
    pub index: u8,
    /// The GID.
    pub gid: [u8; 16],
    /// Its type.
    pub kind: GidType,
    /// The network device it belongs to (RoCE), if the kernel says.
    pub netdev: Option<String>,
}

impl Gid {
    /// Whether it is an IPv4-mapped address (`::ffff:a.b.c.d`).
    pub fn is_ipv4(&self) -> bool {
        self.gid[..10] == [0; 10] && self.gid[10..12] == [0xff, 0xff]
    }

    /// The GID written as eight groups of four hex digits.
    pub fn text(&self) -> String {
        self.gid
            .chunks(2)
            .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// One port of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    /// Port number (from 1).
    pub num: u8,
    /// State as the kernel writes it (`4: ACTIVE`).
    pub state: String,
    /// Link layer.
    pub link: LinkLayer,
    /// LID (InfiniBand).
    pub lid: u16,
    /// Non-zero GIDs.
    pub gids: Vec<Gid>,
}

impl Port {
    /// Whether the port is up.
    pub fn is_active(&self) -> bool {
        self.state.contains("ACTIVE")
    }
}

/// One RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Name (`mlx5_0`).
    pub name: String,
    /// Its ports.
    pub ports: Vec<Port>,
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .take(MAX_ENTRIES)
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort_by_key(|a| natural(&a.0));
    v
}

fn natural(s: &str) -> (u64, String) {
    (s.parse().unwrap_or(u64::MAX), s.to_string())
}

/// Parses a GID as sysfs writes it (`fe80:0000:0000:0000:0202:c9ff:fe00:0001`).
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, grp) in groups.iter().enumerate() {
        let v = u16::from_str_radix(grp, 16).ok()?;
        g[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(g)
}

fn gid_type(s: &str) -> GidType {
    match s.trim() {
        "RoCE v2" => GidType::RoceV2,
        "IB/RoCE v1" | "RoCE v1" | "IB" => GidType::IbRoceV1,
        _ => GidType::Other,
    }
}

fn scan_port(num: u8, dir: &Path) -> Port {
    let link = match read(&dir.join("link_layer")).as_deref() {
        Some("Ethernet") => LinkLayer::Ethernet,
        _ => LinkLayer::InfiniBand,
    };
    let lid = read(&dir.join("lid"))
        .and_then(|l| u16::from_str_radix(l.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    let mut gids = Vec::new();
    for (name, path) in entries(&dir.join("gids")) {
        let (Ok(index), Some(gid)) = (name.parse::<u8>(), read(&path).and_then(|s| parse_gid(&s)))
        else {
            continue;
        };
        if gid == [0; 16] {
            continue; // an unused table entry
        }
        let attrs = dir.join("gid_attrs");
        // Reading the type of an unused entry fails with EINVAL; such entries are skipped
        // above, and an unreadable type of a used one is reported as Other.
        let kind = read(&attrs.join("types").join(&name)).map_or(GidType::Other, |t| gid_type(&t));
        let netdev = read(&attrs.join("ndevs").join(&name)).filter(|n| !n.is_empty());
        gids.push(Gid {
            index,
            gid,
            kind,
            netdev,
        });
    }
    Port {
        num,
        state: read(&dir.join("state")).unwrap_or_else(|| "unknown".into()),
        link,
        lid,
        gids,
    }
}

/// Every device under `root` with its ports; empty when there is none (or no `root`).
pub fn scan(root: &Path) -> Vec<Device> {
    entries(root)
        .into_iter()
        .map(|(name, path)| {
            let ports = entries(&path.join("ports"))
                .into_iter()
                .filter_map(|(n, p)| Some(scan_port(n.parse().ok()?, &p)))
                .collect();
            Device { name, ports }
        })
        .collect()
}

/// The GID index to use on `port`: none on InfiniBand (LIDs address it); on RoCE the
/// configured index when it is `>= 0` and names a GID, otherwise the first RoCE v2
/// GID, IPv4-mapped ones first (what RoCE deployments route).
pub fn select_gid(port: &Port, configured: i32) -> Result<Option<u8>, String> {
    if port.link == LinkLayer::InfiniBand {
        return Ok(None);
    }
    if configured >= 0 {
        return match port.gids.iter().find(|g| i32::from(g.index) == configured) {
            Some(g) => Ok(Some(g.index)),
            None => Err(format!(
                "rdma.gid_index = {configured} names no GID of port {}",
                port.num
            )),
        };
    }
    let v2 = || port.gids.iter().filter(|g| g.kind == GidType::RoceV2);
    v2().find(|g| g.is_ipv4())
        .or_else(|| v2().next())
        .map(|g| Some(g.index))
        .ok_or_else(|| {
            format!(
                "port {} has no RoCE v2 GID (give it an IP address, or set rdma.gid_index)",
                port.num
            )
        })
}

/// The device, port and GID index a configuration selects: the named device (or the
/// first with an active port) and its configured port.
pub fn pick<'a>(
    devices: &'a [Device],
    device: &str,
    port: u8,
    gid_index: i32,
) -> Result<(&'a Device, &'a Port, Option<u8>), String> {
    if devices.is_empty() {
        return Err("no RDMA device is listed in sysfs".into());
    }
    let candidates: Vec<&Device> = match device {
        "" => devices.iter().collect(),
        name => vec![devices
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| format!("no RDMA device named {name:?}"))?],
    };
    let mut why = String::new();
    for d in candidates {
        match d.ports.iter().find(|p| p.num == port) {
            Some(p) if p.is_active() => match select_gid(p, gid_index) {
                Ok(g) => return Ok((d, p, g)),
                Err(e) => why = format!("{}: {e}", d.name),
            },
            Some(p) => why = format!("{} port {port} is {}", d.name, p.state),
            None => why = format!("{} has no port {port}", d.name),
        }
    }
    Err(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn port_dir(root: &Path, dev: &str, port: u8, link: &str, state: &str) -> PathBuf {
        let p = root.join(dev).join("ports").join(port.to_string());
        fs::create_dir_all(p.join("gids")).unwrap();
        fs::create_dir_all(p.join("gid_attrs/types")).unwrap();
        fs::create_dir_all(p.join("gid_attrs/ndevs")).unwrap();
        fs::write(p.join("link_layer"), format!("{link}\n")).unwrap();
        fs::write(p.join("state"), format!("{state}\n")).unwrap();
        fs::write(p.join("lid"), "0x1c\n").unwrap();
        p
    }

    fn gid(p: &Path, i: u8, gid: &str, kind: &str) {
        fs::write(p.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
        if !kind.is_empty() {
            fs::write(p.join("gid_attrs/types").join(i.to_string()), kind).unwrap();
            fs::write(p.join("gid_attrs/ndevs").join(i.to_string()), "eth0\n").unwrap();
        }
    }

    const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
    const LINK_LOCAL: &str = "fe80:0000:0000:0000:5054:00ff:fe12:3456";
    const V4: &str = "0000:0000:0000:0000:0000:ffff:0a00:0007";

    /// A RoCE port as the kernel lays it out: v1 and v2 entries for the link-local
    /// address and for an IPv4 address, plus unused zero entries.
    fn roce_tree(root: &Path) {
        let p = port_dir(root, "rxe0", 1, "Ethernet", "4: ACTIVE");
        gid(&p, 0, LINK_LOCAL, "IB/RoCE v1\n");
        gid(&p, 1, LINK_LOCAL, "RoCE v2\n");
        gid(&p, 2, V4, "IB/RoCE v1\n");
        gid(&p, 3, V4, "RoCE v2\n");
        gid(&p, 4, ZERO, "");
    }

    #[test]
    fn scans_a_fake_tree_and_picks_the_ipv4_roce_v2_gid() {
        let dir = tempfile::tempdir().unwrap();
        roce_tree(dir.path());
        let devs = scan(dir.path());
        assert_eq!(devs.len(), 1);
        let port = &devs[0].ports[0];
        assert_eq!(
            (port.num, port.link, port.lid),
            (1, LinkLayer::Ethernet, 0x1c)
        );
        assert!(port.is_active());
        assert_eq!(port.gids.len(), 4, "the zero entry is skipped");
        assert_eq!(port.gids[1].kind, GidType::RoceV2);
        assert_eq!(port.gids[3].netdev.as_deref(), Some("eth0"));
        assert_eq!(port.gids[3].text(), V4);
        assert_eq!(select_gid(port, -1), Ok(Some(3)));
        let (d, p, g) = pick(&devs, "", 1, -1).unwrap();
        assert_eq!((d.name.as_str(), p.num, g), ("rxe0", 1, Some(3)));
    }

    #[test]
    fn configured_gid_index_overrides_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        roce_tree(dir.path());
        let port = &scan(dir.path())[0].ports[0];
        assert_eq!(select_gid(port, 1), Ok(Some(1)));
        assert!(select_gid(port, 4).unwrap_err().contains("names no GID"));
    }

    #[test]
    fn link_local_v2_is_used_when_no_ipv4_gid_exists() {
        let dir = tempfile::tempdir().unwrap();
        let p = port_dir(dir.path(), "mlx5_0", 1, "Ethernet", "4: ACTIVE");
        gid(&p, 0, LINK_LOCAL, "IB/RoCE v1\n");
        gid(&p, 1, LINK_LOCAL, "RoCE v2\n");
        let devs = scan(dir.path());
        assert_eq!(select_gid(&devs[0].ports[0], -1), Ok(Some(1)));
        // Only v1 entries: refused with the way out named.
        let q = port_dir(dir.path(), "mlx5_1", 1, "Ethernet", "4: ACTIVE");
        gid(&q, 0, LINK_LOCAL, "IB/RoCE v1\n");
        let e = select_gid(&scan(dir.path())[1].ports[0], -1).unwrap_err();
        assert!(e.contains("rdma.gid_index"), "{e}");
    }

    #[test]
    fn infiniband_uses_the_lid_and_down_ports_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        port_dir(dir.path(), "mlx4_0", 1, "InfiniBand", "1: DOWN");
        let ib = port_dir(dir.path(), "mlx4_1", 1, "InfiniBand", "4: ACTIVE");
        gid(&ib, 0, LINK_LOCAL, "IB/RoCE v1\n");
        let devs = scan(dir.path());
        let (d, p, g) = pick(&devs, "", 1, -1).unwrap();
        assert_eq!((d.name.as_str(), p.lid, g), ("mlx4_1", 0x1c, None));
        let e = pick(&devs, "mlx4_0", 1, -1).unwrap_err();
        assert!(e.contains("DOWN"), "{e}");
        assert!(pick(&devs, "mlx4_1", 2, -1)
            .unwrap_err()
            .contains("no port 2"));
        assert!(pick(&devs, "nope", 1, -1).is_err());
    }

    #[test]
    fn no_tree_means_no_devices() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scan(&dir.path().join("missing")).is_empty());
        assert!(pick(&[], "", 1, -1).unwrap_err().contains("no RDMA device"));
        assert_eq!(parse_gid("fe80::1"), None);
    }
}
