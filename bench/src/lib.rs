//! `oncilla-bench`: the programs that measure an Oncilla cluster and print
//! tables, fronted by `ocmctl bench` (same subcommands, flags and output).
//! They measure; they assert nothing but that bytes read back (and, for the
//! soak, that nothing is corrupted or leaked).
//!
//! - `alloc` ([`alloc`]): alloc and free latency by size, beside the
//!   original Oncilla's published figures.
//! - `copy` ([`copy`]): copy latency and bandwidth beside the raw TCP
//!   baseline ([`rawtcp`]); clients at once as threads and as processes
//!   ([`procbench`]); a batch against one copy at a time.
//! - `placement` ([`bandwidth`]): copy bandwidth by where the bytes live.
//! - `gpu` ([`gpu`]): `copy` between every pair of kinds (GPU ones where
//!   there is a GPU) beside cudaMemcpy, memcpy and `copy_in`/`copy_out`.
//! - `map` ([`map`]): remote memory through a pointer (`Allocation::map`)
//!   beside copies of the same bytes: a scan, cold touches, write-back, and
//!   a sort four times the mapping's budget beside the same sort locally.
//! - `raw-server` ([`rawtcp`]): the raw TCP baseline's server.
//! - `soak` ([`soak`]): fault injection with verification.
//! - `flood` ([`flood`]): copy latency while hostile connections are held
//!   open against the data port (loopback, its own cluster).
//! - `fair` ([`fair`]): a normal tenant's latency alone and beside a greedy
//!   tenant (another user pressing on every shared resource).
//! - `takeover` ([`takeover`]): kill -9 of the leading master to the first
//!   allocation done, with one etcd member and with three.
//! - `table` ([`table`]): the master's cost per allocation as its table
//!   fills (allocations/s, alloc/free p50/p99, its CPU and memory).
//! - `rate` ([`rate`]): allocations per second by clients and batch size
//!   (`alloc` and `alloc_many`), also against an earlier build's daemons.
//!
//! Local clusters come from [`oncilla_cluster`], started with the
//! [`Daemon`] the caller passes (`ocmctl` re-executes itself). `copy`
//! starts its worker processes as `<this program> bench copy-worker`, so
//! the program that fronts this crate must route that subcommand to
//! [`procbench::worker`] (as [`run`] does). Shared pieces (tables,
//! percentiles, patterns, the agent probe) sit in [`table`], [`report`] and
//! [`probe`], below every benchmark: no benchmark imports another's
//! internals except `copy` using [`rawtcp`] and [`procbench`].

pub mod alloc;
pub mod bandwidth;
pub mod copy;
pub mod error;
pub mod fair;
pub mod flood;
pub mod gpu;
pub mod map;
pub mod pages;
pub mod probe;
pub mod procbench;
pub mod rate;
pub mod rawtcp;
pub mod replicas;
pub mod report;
pub mod soak;
pub mod table;
pub mod takeover;

pub use error::BenchError;
use oncilla_cluster::{Config, Daemon};

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// Latency of allocating and freeing remote memory, by size.
    Alloc(alloc::AllocArgs),
    /// Copy latency and bandwidth to a remote node by size, direction and
    /// connections, beside raw TCP over the same path; clients at once; a
    /// batch against one copy at a time.
    Copy(copy::CopyArgs),
    /// Copy bandwidth by placement: one remote node, three striped,
    /// same-node shared memory, and a plain memcpy.
    Placement(bandwidth::PlacementArgs),
    /// `copy` between every pair of kinds (local/remote host/GPU) by size,
    /// beside cudaMemcpy with page-locked memory, memcpy and
    /// `copy_in`/`copy_out` of the same bytes, with a ratio column; the
    /// host pairs only where there is no GPU.
    Gpu(gpu::GpuArgs),
    /// Remote memory through a pointer (`Allocation::map`) beside copies of
    /// the same bytes: a sequential scan against copy_out, cold random
    /// touches against an 8-byte copy_out, write-back against copy_in, and
    /// a sort of an array four times the mapping's budget against the same
    /// sort in local memory.
    Map(map::MapArgs),
    /// Serve the raw TCP baseline that `bench copy --raw` measures against
    /// (run it beside the target agent).
    RawServer(copy::RawServerArgs),
    /// One of the processes `bench copy` starts to copy at once (internal).
    #[command(hide = true)]
    CopyWorker(procbench::WorkerArgs),
    /// Several clients allocate, copy, verify and free at random while one
    /// agent is killed and restarted; counts corrupted bytes and leaks.
    Soak(soak::SoakArgs),
    /// Copy latency (p50/p99 of 4 KiB and 1 MiB copies, and of a new
    /// connection's first copy) while idle and dripping hostile connections
    /// are held open against the data port; a local cluster on loopback.
    Flood(flood::FloodArgs),
    /// A normal tenant's alloc and 1 MiB copy latency (p50/p99) alone and
    /// beside a greedy tenant that allocates, opens sessions, copies and
    /// pulls as fast as it can; a local cluster on loopback.
    Fair(fair::FairArgs),
    /// Masters elected through a real etcd (one member, then three): the
    /// time from kill -9 of the leader to the first allocation done.
    Takeover(takeover::TakeoverArgs),
    /// Writes and reads of a replicated allocation with 1, 2 and 3 copies
    /// (4 KiB write p50/p99, large write and read bandwidth), beside raw
    /// TCP; a local cluster on loopback.
    Replicas(replicas::ReplicasArgs),
    /// The master's cost per allocation as its table fills: sessions hold
    /// 4 KiB allocations up to each stage; per stage allocations/s while
    /// filling, the master's CPU, alloc and free p50/p99 and its memory.
    Table(table::TableArgs),
    /// Allocations per second for clients making many small ones, one at a
    /// time and in batches (`alloc_many`), by number of clients; also
    /// against the daemons of an earlier build (`--daemons`).
    Rate(rate::RateArgs),
    /// One of the sessions `bench table` fills with (internal).
    #[command(hide = true)]
    TableFiller(table::FillerArgs),
    /// The greedy tenant `bench fair` starts (internal).
    #[command(hide = true)]
    FairGreedy(fair::GreedyArgs),
}

/// Runs one benchmark; local clusters run their daemons with `daemon`.
///
/// # Errors
/// Whatever the benchmark reports (bad options, a cluster that does not
/// start, failed copies, data that does not read back, corruption, leaks).
pub fn run(bench: &Bench, daemon: &Daemon) -> Result<(), BenchError> {
    match bench {
        Bench::Alloc(args) => alloc::run(args, daemon),
        Bench::Copy(args) => copy::run(args, daemon),
        Bench::Placement(args) => bandwidth::run(args, daemon),
        Bench::Gpu(args) => gpu::run(args, daemon),
        Bench::Map(args) => map::run(args, daemon),
        Bench::RawServer(args) => copy::raw_server(args),
        Bench::CopyWorker(args) => procbench::worker(args),
        Bench::Soak(args) => soak::run(args, daemon),
        Bench::Flood(args) => flood::run(args, daemon),
        Bench::Fair(args) => fair::run(args, daemon),
        Bench::FairGreedy(args) => fair::greedy(args),
        Bench::Takeover(args) => takeover::run(args, daemon),
        Bench::Replicas(args) => replicas::run(args, daemon),
        Bench::Table(args) => table::run(args, daemon),
        Bench::Rate(args) => rate::run(args, daemon),
        Bench::TableFiller(args) => table::filler(args),
    }
}

/// A local cluster of `capacities` (bytes per agent) as `ocmctl` starts
/// them.
pub(crate) fn local(daemon: &Daemon, capacities: &[u64]) -> Config {
    Config::new(daemon.clone(), capacities).dir_prefix("oncilla-demo")
}
