//! `ocmctl alloc`: a persistent allocation in the cluster, placed as the
//! flags say; prints the new id (or the allocation as JSON). The request
//! is built through `AllocSpec::new`, the model's one check.

use oncilla_model::alloc::{AllocSpec, NodeShare, Placement};
use oncilla_model::size::parse_size;
use oncilla_model::{Fabric, Kind, Policy};
use oncilla_ops::Conn;

use crate::error::CliError;
use crate::render;

/// Options of `ocmctl alloc`.
#[derive(Debug, clap::Args)]
#[deny(missing_docs)]
pub struct Args {
    /// Size, e.g. 64MiB or 4GiB.
    size: String,
    /// How to choose nodes when none is named.
    #[arg(long, value_enum, default_value_t = PolicyArg::LocalFirst)]
    policy: PolicyArg,
    /// Place on this node (repeat the flag); overrides --policy.
    #[arg(long = "node", value_name = "NAME")]
    nodes: Vec<String>,
    /// Weight of each --node, in the same order [default: 1 each].
    #[arg(long = "weight", value_name = "W")]
    weights: Vec<u32>,
    /// Deal the allocation out in chunks of this size (a multiple of
    /// 4KiB), node after node; needs --policy spread or --node.
    #[arg(long, value_name = "SIZE")]
    stripe: Option<String>,
    /// Name it, so any process can attach it by name.
    #[arg(long)]
    name: Option<String>,
    /// GPU memory (remote-gpu) instead of host memory: on this device
    /// index of the one --node, or give `any` for any GPU with room.
    #[arg(long, value_name = "INDEX|any")]
    gpu: Option<String>,
    /// Copies of every byte, each on another node (and another zone where
    /// nodes declare zones), 1 to 3: reads survive the loss of a copy.
    #[arg(long, value_name = "N", default_value_t = 1)]
    replicas: u32,
    #[command(flatten)]
    conn: Conn,
    /// Print the allocation as JSON.
    #[arg(long)]
    json: bool,
}

/// Allocates.
///
/// # Errors
/// Bad flags (refused here, in the master's words); the master cannot be
/// reached or refuses.
pub fn run(args: &Args) -> Result<(), CliError> {
    let spec = alloc_spec(args)?;
    let a = args.conn.connect()?.allocate(spec)?;
    if args.json {
        crate::stdout::json(&render::allocs::json(&a))?;
    } else {
        crate::stdout::print(format_args!("{}\n", a.id))?;
    }
    Ok(())
}

/// `--policy` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PolicyArg {
    /// The emptiest node that holds it all, else spill to the next.
    LocalFirst,
    /// An equal share on every live node with room.
    Spread,
    /// As few nodes as possible.
    Pack,
}

/// The spec of `ocmctl alloc`: a persistent allocation over TCP (the
/// operator copies with `put` and `get`), on GPU `gpu` ("any" or an index)
/// when given.
fn alloc_spec(args: &Args) -> Result<AllocSpec, CliError> {
    let (nodes, weights, gpu) = (args.nodes.clone(), &args.weights, args.gpu.as_deref());
    let size = parse_size(&args.size).map_err(|e| CliError::Other(e.to_string()))?;
    let stripe = args
        .stripe
        .as_deref()
        .map(|s| parse_size(s).map_err(|e| CliError::Other(format!("--stripe: {e}"))))
        .transpose()?
        .unwrap_or(0);
    if !weights.is_empty() && weights.len() != nodes.len() {
        return Err(CliError::Other(format!(
            "--weight given {} times for {} --node; give one per node or none",
            weights.len(),
            nodes.len()
        )));
    }
    if weights.contains(&0) {
        return Err(CliError::Other("--weight must be at least 1".into()));
    }
    let policy = match args.policy {
        PolicyArg::LocalFirst => Policy::LocalFirst,
        PolicyArg::Spread => Policy::Spread,
        PolicyArg::Pack => Policy::Pack,
    };
    let gpu_index = match gpu {
        None | Some("any") => None,
        Some(g) => Some(g.parse::<u32>().map_err(|_| {
            CliError::Other(format!("--gpu: {g:?} is not a device index or `any`"))
        })?),
    };
    let placement = Placement {
        policy,
        nodes: nodes
            .into_iter()
            .enumerate()
            .map(|(i, node)| NodeShare {
                node,
                weight: weights.get(i).copied().unwrap_or(1),
            })
            .collect(),
        stripe,
        gpu: gpu_index,
        replicas: args.replicas,
    };
    let kind = if gpu.is_some() {
        Kind::RemoteGpu
    } else {
        Kind::RemoteHost
    };
    // An operator's allocation has no user: any process may attach it.
    AllocSpec::new(
        size,
        kind,
        placement,
        args.name.clone().unwrap_or_default(),
        true,
        Fabric::Tcp,
    )
    // In the master's words for the same refusal.
    .map_err(|e| CliError::Other(format!("invalid request: {e}")))
}
