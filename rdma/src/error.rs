//! Every way the RDMA layer fails, one variant per failing verb or step,
//! with the OS error (errno) as its source where the kernel gave one.
//!
//! This module only names failures; it never decides what a caller does
//! about one (the client maps them to its own error classes).

use std::io;
use std::path::PathBuf;

use crate::qp::State;
use crate::wc::Failure;

/// A failure of discovery, queue-pair pairing or a verb.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    // --- sysfs discovery and port selection ---
    /// The sysfs directory of RDMA devices cannot be read.
    #[error("no RDMA devices: {} cannot be read ({source}); the kernel has no RDMA support loaded or there is no HCA", root.display())]
    NoSysfs { root: PathBuf, source: io::Error },
    /// The directory lists no device with a port.
    #[error("no RDMA devices under {}", root.display())]
    NoDevices { root: PathBuf },
    /// No port selected and none is active; `found` lists what there is.
    #[error("no active RDMA port (found {found})")]
    NoActivePort { found: String },
    /// `NAME:PORT` whose port is not a number.
    #[error("--rdma-device {wanted:?}: the port must be a number, as in mlx5_0:1")]
    BadPortNumber { wanted: String },
    /// A selection that names no port of this node.
    #[error("--rdma-device {wanted:?}: no such port; this node has {have}")]
    NoSuchPort { wanted: String, have: String },
    /// A selected port that is not active.
    #[error("--rdma-device {wanted:?}: {label} is {state}")]
    PortNotActive {
        wanted: String,
        label: String,
        state: String,
    },
    /// A NUMA node's CPU list cannot be read.
    #[error("cannot read {}", path.display())]
    CpuListRead { path: PathBuf, source: io::Error },
    /// A NUMA node's CPU list does not parse.
    #[error("{}: cannot parse {list:?}", path.display())]
    CpuListParse { path: PathBuf, list: String },

    // --- queue-pair life and pairing (pure) ---
    /// A queue-pair state change the life of a pair does not allow.
    #[error("queue pair cannot go from {from:?} to {to:?}")]
    Transition { from: State, to: State },
    /// The two ends are on different link layers.
    #[error("link layers differ: this end is {local}, the peer {remote}")]
    LinkLayers {
        local: &'static str,
        remote: &'static str,
    },
    /// The peer's queue pair number is 0 or above 24 bits.
    #[error("peer queue pair number {0} is not valid")]
    PeerQpNum(u32),
    /// A packet sequence number above 24 bits.
    #[error("packet sequence numbers are 24 bits")]
    Psn,
    /// An MTU that is not 256..4096 bytes, a power of two.
    #[error("MTUs must be 256..4096 bytes, powers of two: this end {local}, the peer {remote}")]
    Mtu { local: u32, remote: u32 },
    /// A RoCE peer that sent no GID.
    #[error("the peer is on RoCE but sent no GID")]
    PeerNoGid,
    /// An InfiniBand peer without a LID.
    #[error("the peer is on InfiniBand but has no LID (is a subnet manager running?)")]
    PeerNoLid,
    /// The peer needs global routing and this port has no GID.
    #[error("the peer needs global routing but this port has no GID")]
    LocalNoGid,
    /// A GID table index that does not fit the verbs attribute.
    #[error("GID index {0} is above 255")]
    GidIndex(u32),

    // --- verbs (feature `verbs`) ---
    /// libibverbs cannot list the devices.
    #[error("libibverbs cannot list devices: {0}")]
    ListDevices(#[source] io::Error),
    /// The kernel has the device, user-space verbs no provider for it.
    #[error("the kernel lists {device} but libibverbs has no provider for it (install ibverbs-providers / rdma-core)")]
    NoProvider { device: String },
    /// A build without the `verbs` feature: no port can be opened.
    #[error("this build has no verbs support (rebuild with `cargo build --features verbs`)")]
    NotBuilt,
    /// A port number the verbs API cannot take.
    #[error("port {0} is above 255")]
    PortNumber(u32),
    /// `ibv_get_device_list` failed.
    #[error("ibv_get_device_list: {0}")]
    GetDeviceList(#[source] io::Error),
    /// `ibv_open_device` failed (or the device vanished from the list).
    #[error("ibv_open_device({device}): {source}")]
    OpenDevice { device: String, source: io::Error },
    /// `ibv_query_port` failed.
    #[error("ibv_query_port({port}): {source}")]
    QueryPort { port: String, source: io::Error },
    /// `ibv_query_gid` failed.
    #[error("ibv_query_gid({port}, {index}): {source}")]
    QueryGid {
        port: String,
        index: u32,
        source: io::Error,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd: {0}")]
    AllocPd(#[source] io::Error),
    /// `ibv_reg_mr` of host memory failed.
    #[error("ibv_reg_mr of {len} bytes on {port} (check `ulimit -l`): {source}")]
    RegisterMr {
        len: usize,
        port: String,
        source: io::Error,
    },
    /// Device memory: nvidia-peermem refused and there is no dma-buf.
    #[error("ibv_reg_mr of device memory (nvidia-peermem): {peermem}; no dma-buf export of it: {source}")]
    NoDmabuf {
        peermem: io::Error,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Device memory: both nvidia-peermem and the dma-buf refused.
    #[error(
        "ibv_reg_mr of device memory (nvidia-peermem): {peermem}; ibv_reg_dmabuf_mr: {source}"
    )]
    RegisterDmabuf {
        peermem: io::Error,
        source: io::Error,
    },
    /// A memory range longer than the verbs API or this machine can take.
    #[error("{what} of {len} bytes is larger than memory")]
    TooLong { what: &'static str, len: u64 },
    /// Every registration tried got a key revoked too recently.
    #[error("{port}: every one of {tries} registrations got a recently revoked key")]
    StaleKeys { port: String, tries: usize },
    /// A completion queue depth the verbs API cannot take.
    #[error("queue depth {0} too large")]
    QueueDepth(u32),
    /// `ibv_create_cq` failed.
    #[error("ibv_create_cq: {0}")]
    CreateCq(#[source] io::Error),
    /// `ibv_create_qp` failed.
    #[error("ibv_create_qp: {0}")]
    CreateQp(#[source] io::Error),
    /// `ibv_modify_qp` to a state failed.
    #[error("ibv_modify_qp to {to:?}: {source}")]
    ModifyQp { to: State, source: io::Error },
    /// `ibv_query_qp` failed.
    #[error("ibv_query_qp: {0}")]
    QueryQp(#[source] io::Error),
    /// The provider's ops table lacks a verb.
    #[error("the verbs provider has no {0}")]
    NoProviderOp(&'static str),
    /// `ibv_post_send` failed (send queue full, malformed request).
    #[error("ibv_post_send: {0}")]
    PostSend(#[source] io::Error),
    /// `ibv_poll_cq` failed.
    #[error("ibv_poll_cq failed (completion queue overrun?)")]
    PollCq,
    /// A work request completed with an error status.
    #[error("work request {wr_id}: {failure} (vendor error {vendor_err:#x})")]
    Completion {
        wr_id: u64,
        failure: Failure,
        vendor_err: u32,
    },
}
