//! RDMA device discovery from sysfs: devices, ports, link layer, state,
//! LID, GID table, rate and the HCA's NUMA node.
//!
//! It reads `/sys/class/infiniband` (or a root given by tests) and nothing
//! else; it never opens a device. The active MTU is not in sysfs: the
//! verbs layer fills it in when it opens a port.

use std::fs;
use std::path::{Path, PathBuf};

use crate::RdmaError;

/// Where the kernel lists RDMA devices.
pub const SYSFS: &str = "/sys/class/infiniband";

/// One port of one RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub device: String,
    pub port: u32,
    /// "InfiniBand" or "Ethernet" (RoCE).
    pub link_layer: String,
    /// "ACTIVE", "DOWN", "INIT", ...
    pub state: String,
    pub lid: u32,
    /// Indices of the non-zero GID table entries, with their type
    /// ("IB/RoCE v1", "RoCE v2"; empty when sysfs does not say).
    pub gids: Vec<(u32, String)>,
    /// -1 when the platform does not say.
    pub numa_node: i32,
    pub rate: String,
    /// Bytes; 0 until the verbs layer queried the port.
    pub active_mtu: u32,
}

impl Port {
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }

    /// RoCE (Ethernet) ports need a GID on every packet; InfiniBand ports
    /// route by LID.
    pub fn is_roce(&self) -> bool {
        self.link_layer == "Ethernet"
    }

    /// The GID index to address this port by: on RoCE the first RoCE v2
    /// entry (routable over IP), else the first non-zero one.
    pub fn gid_index(&self) -> Option<u32> {
        self.gids
            .iter()
            .find(|(_, t)| t.contains("v2"))
            .or_else(|| self.gids.first())
            .map(|(i, _)| *i)
    }

    /// `device:port`, as `--rdma-device` takes it.
    pub fn label(&self) -> String {
        format!("{}:{}", self.device, self.port)
    }
}

/// Every port of every device under `root` (normally [`SYSFS`]), sorted
/// by device and port.
///
/// # Errors
/// Why there is nothing to list: no such directory (the kernel has no
/// RDMA support loaded: [`RdmaError::NoSysfs`]), or no devices in it
/// ([`RdmaError::NoDevices`]).
pub fn ports(root: &Path) -> Result<Vec<Port>, RdmaError> {
    let devices = fs::read_dir(root).map_err(|source| RdmaError::NoSysfs {
        root: root.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for dev in devices.flatten() {
        let name = dev.file_name().to_string_lossy().into_owned();
        let dir = dev.path();
        let numa_node = read(&dir.join("device/numa_node"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1);
        let Ok(port_dirs) = fs::read_dir(dir.join("ports")) else {
            continue;
        };
        for p in port_dirs.flatten() {
            let Some(port) = p.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            out.push(read_port(&name, port, &p.path(), numa_node));
        }
    }
    if out.is_empty() {
        return Err(RdmaError::NoDevices {
            root: root.to_path_buf(),
        });
    }
    out.sort_by(|a, b| (&a.device, a.port).cmp(&(&b.device, b.port)));
    Ok(out)
}

fn read_port(device: &str, port: u32, dir: &Path, numa_node: i32) -> Port {
    // "4: ACTIVE" -> "ACTIVE"
    let state = read(&dir.join("state"))
        .map(|s| {
            s.split_once(':')
                .map_or(s.clone(), |(_, n)| n.trim().to_string())
        })
        .unwrap_or_else(|| "UNKNOWN".into());
    let lid = read(&dir.join("lid"))
        .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    let mut gids = Vec::new();
    if let Ok(entries) = fs::read_dir(dir.join("gids")) {
        for e in entries.flatten() {
            let Some(i) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Some(g) = read(&e.path()) else { continue };
            if g.chars().all(|c| c == '0' || c == ':') {
                continue;
            }
            let kind = read(&dir.join(format!("gid_attrs/types/{i}"))).unwrap_or_default();
            gids.push((i, kind));
        }
    }
    gids.sort();
    Port {
        device: device.to_string(),
        port,
        link_layer: read(&dir.join("link_layer")).unwrap_or_else(|| "InfiniBand".into()),
        state,
        lid,
        gids,
        numa_node,
        rate: read(&dir.join("rate")).unwrap_or_default(),
        active_mtu: 0,
    }
}

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Which ports `--rdma-device` picks: `NAME` (every port of it) or
/// `NAME:PORT`; none given means every active port.
///
/// # Errors
/// A selection that names no port, or names one that is not active.
pub fn select(all: &[Port], wanted: &[String]) -> Result<Vec<Port>, RdmaError> {
    if wanted.is_empty() {
        let active: Vec<Port> = all.iter().filter(|p| p.is_active()).cloned().collect();
        if active.is_empty() {
            return Err(RdmaError::NoActivePort {
                found: all
                    .iter()
                    .map(|p| format!("{} {}", p.label(), p.state))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        return Ok(active);
    }
    let mut out = Vec::new();
    for w in wanted {
        let (dev, port) = match w.split_once(':') {
            Some((d, p)) => (
                d,
                Some(
                    p.parse::<u32>()
                        .map_err(|_| RdmaError::BadPortNumber { wanted: w.clone() })?,
                ),
            ),
            None => (w.as_str(), None),
        };
        let hits: Vec<&Port> = all
            .iter()
            .filter(|p| p.device == dev && port.is_none_or(|n| n == p.port))
            .collect();
        if hits.is_empty() {
            return Err(RdmaError::NoSuchPort {
                wanted: w.clone(),
                have: all.iter().map(Port::label).collect::<Vec<_>>().join(", "),
            });
        }
        for p in hits {
            if !p.is_active() {
                return Err(RdmaError::PortNotActive {
                    wanted: w.clone(),
                    label: p.label(),
                    state: p.state.clone(),
                });
            }
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
    }
    Ok(out)
}

/// The CPUs local to a NUMA node, from `/sys/devices/system/node/nodeN/cpulist`
/// under `root` (normally `/`).
///
/// # Errors
/// The node's CPU list cannot be read or parsed.
pub fn numa_cpus(root: &Path, node: i32) -> Result<Vec<usize>, RdmaError> {
    let path: PathBuf = root.join(format!("sys/devices/system/node/node{node}/cpulist"));
    let list = match fs::read_to_string(&path) {
        Ok(s) => s.trim().to_string(),
        Err(source) => return Err(RdmaError::CpuListRead { path, source }),
    };
    match parse_cpulist(&list) {
        Some(cpus) => Ok(cpus),
        None => Err(RdmaError::CpuListParse { path, list }),
    }
}

/// "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11].
pub fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 4096 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs tree like a real host's: one IB HCA with one active port on
    /// NUMA node 1, one RoCE NIC with an active and a down port.
    fn fake_sysfs() -> tempdir::Dir {
        let d = tempdir::Dir::new("rdma-sysfs");
        let w = |p: &str, v: &str| {
            let path = d.path().join(p);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, format!("{v}\n")).unwrap();
        };
        w("mlx5_0/device/numa_node", "1");
        w("mlx5_0/ports/1/state", "4: ACTIVE");
        w("mlx5_0/ports/1/link_layer", "InfiniBand");
        w("mlx5_0/ports/1/lid", "0x1a");
        w("mlx5_0/ports/1/rate", "100 Gb/sec (4X EDR)");
        w(
            "mlx5_0/ports/1/gids/0",
            "fe80:0000:0000:0000:0002:c903:00f1:a0b1",
        );
        w(
            "mlx5_0/ports/1/gids/1",
            "0000:0000:0000:0000:0000:0000:0000:0000",
        );
        w("rxe0/device/numa_node", "-1");
        w("rxe0/ports/1/state", "4: ACTIVE");
        w("rxe0/ports/1/link_layer", "Ethernet");
        w("rxe0/ports/1/lid", "0x0");
        w(
            "rxe0/ports/1/gids/0",
            "fe80:0000:0000:0000:5054:00ff:fe12:3456",
        );
        w("rxe0/ports/1/gid_attrs/types/0", "IB/RoCE v1");
        w(
            "rxe0/ports/1/gids/1",
            "0000:0000:0000:0000:0000:ffff:0a00:0001",
        );
        w("rxe0/ports/1/gid_attrs/types/1", "RoCE v2");
        w("rxe0/ports/2/state", "1: DOWN");
        w("rxe0/ports/2/link_layer", "Ethernet");
        d
    }

    #[test]
    fn reads_devices_ports_gids_and_numa() {
        let d = fake_sysfs();
        let ports = ports(d.path()).unwrap();
        assert_eq!(ports.len(), 3);
        let ib = &ports[0];
        assert_eq!((ib.device.as_str(), ib.port), ("mlx5_0", 1));
        assert!(ib.is_active() && !ib.is_roce());
        assert_eq!(ib.lid, 0x1a);
        assert_eq!(ib.numa_node, 1);
        assert_eq!(ib.gids.len(), 1, "zero GIDs are skipped");
        assert_eq!(ib.gid_index(), Some(0));
        let roce = &ports[1];
        assert!(roce.is_roce());
        assert_eq!(roce.gid_index(), Some(1), "RoCE v2 preferred");
        assert_eq!(roce.numa_node, -1);
        assert_eq!(ports[2].state, "DOWN");
    }

    #[test]
    fn missing_sysfs_says_why() {
        let err = ports(Path::new("/nonexistent/infiniband"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no RDMA support"), "{err}");
        let d = tempdir::Dir::new("rdma-empty");
        assert!(ports(d.path())
            .unwrap_err()
            .to_string()
            .contains("no RDMA devices"));
    }

    #[test]
    fn selection_by_name_and_port() {
        let d = fake_sysfs();
        let all = ports(d.path()).unwrap();
        let active = select(&all, &[]).unwrap();
        assert_eq!(active.len(), 2, "default: every active port");
        let one = select(&all, &["rxe0:1".into()]).unwrap();
        assert_eq!(one.len(), 1);
        assert!(select(&all, &["rxe0:2".into()])
            .unwrap_err()
            .to_string()
            .contains("DOWN"));
        assert!(select(&all, &["rxe0".into()])
            .unwrap_err()
            .to_string()
            .contains("DOWN"));
        assert!(select(&all, &["mlx5_9".into()])
            .unwrap_err()
            .to_string()
            .contains("this node has"));
        assert!(select(&all, &["mlx5_0:x".into()])
            .unwrap_err()
            .to_string()
            .contains("number"));
        let down_only: Vec<Port> = all.iter().filter(|p| !p.is_active()).cloned().collect();
        assert!(select(&down_only, &[])
            .unwrap_err()
            .to_string()
            .contains("no active"));
    }

    #[test]
    fn cpulists() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a"), None);
    }

    /// A scratch directory removed on drop.
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new(tag: &str) -> Self {
                let p = std::env::temp_dir().join(format!(
                    "oncilla-{tag}-{}-{}",
                    std::process::id(),
                    rand::random::<u32>()
                ));
                std::fs::create_dir_all(&p).unwrap();
                Self(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
