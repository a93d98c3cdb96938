//! The placement lab behind `magpie simulate`.
//!
//! It reproduces the classic consistent-hashing experiment: place keys
//! `user:0 … user:{K−1}` on nodes `0 … N−1`, let node `N` join (or one node
//! leave), and measure for each scheme the share of keys that changed owner,
//! whether every moved key went to the new node, and the busiest node's key
//! count over the mean, before and after. Options add the usual follow-up
//! questions: weights, hot keys, salting, replicas across zones.
//!
//! The conventions are fixed so results compare with other implementations of
//! the same experiment (docs/labs.md lists them): key hash = `h64(key text)`;
//! mod N and jump number the nodes `0 … N−1` numerically; rendezvous takes the
//! largest `h64("{n}|{key}")`, ties to the earlier node. Where the library
//! scheme is the convention (ring points, Maglev, jump, mod N, bounded caps),
//! the lab calls the library, so it measures the code that routes traffic.
//! Node indices of a `NodeSet` follow *name* order ("0", "1", "10", "2", …);
//! the lab always translates them back to node numbers.
//!
//! | module | owns |
//! |---|---|
//! | [`experiment`] | the validated experiment: options, pools before and after, keys |
//! | [`place`] | placing every key with each scheme |
//! | `parallel` | running independent placements side by side |
//! | [`report`] | running the experiment into a [`Report`] (pure, deterministic) |
//! | [`mod@render`] | the human-readable table |
//!
//! [`run`] is pure (no I/O); [`main`] parses, runs and prints.

use std::io::Write as _;

pub mod experiment;
mod parallel;
pub mod place;
pub mod render;
pub mod report;

pub use experiment::{Change, Experiment, Hot};
pub use place::SchemeId;
pub use render::render;
pub use report::{ChangeKind, Received, ReplicaReport, Report, Row, WeightShare, run};

use magpie_core::placement::PlacementError;

/// The schemes, in the order of the table and of `rows` in `--json`.
pub const SCHEMES: [&str; 9] = {
    let mut ids = [""; 9];
    let mut i = 0;
    while i < ids.len() {
        ids[i] = SchemeId::ALL[i].as_str();
        i += 1;
    }
    ids
};

/// bounded-ring's factor c and its points per node.
pub const BOUNDED_FACTOR: f64 = 1.10;
const BOUNDED_POINTS: u32 = 100;
/// The ring the `--replicas` walk uses.
const REPLICA_POINTS: u32 = 100;

const MAX_KEYS: u64 = 10_000_000;
const MAX_NODES: u32 = 1000;
/// ring-1000 gives a node 1000 · weight points; this keeps rings in memory.
const MAX_WEIGHT: u32 = 100;
const MAX_SALT: u32 = 1000;

/// `magpie simulate`'s options.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SimulateArgs {
    /// Number of keys, named user:0 … user:{N-1}.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Nodes before the change, named 0 … N-1; node N then joins.
    #[arg(long, default_value_t = 10)]
    pub nodes: u32,
    /// Remove this node instead of adding one; reports where its keys went.
    #[arg(long, value_name = "NODE")]
    pub remove: Option<String>,
    /// Give NODE the weight W (others weigh 1); repeatable.
    #[arg(long, value_name = "NODE=W")]
    pub weight: Vec<String>,
    /// Keys whose index is divisible by round(1/FRACTION) carry FACTOR times
    /// the request load; reports the peak request load over the mean.
    #[arg(long, value_name = "FRACTION:FACTOR")]
    pub hot: Option<String>,
    /// Split each hot key into K sub-keys `{key}#s{i}` (needs --hot).
    #[arg(long, value_name = "K")]
    pub salt: Option<u32>,
    /// Place R replicas per key on the 100-point ring (needs --zones).
    #[arg(long, value_name = "R")]
    pub replicas: Option<u32>,
    /// Put node i in zone i mod Z and require distinct zones (needs --replicas).
    #[arg(long, value_name = "Z")]
    pub zones: Option<u32>,
    /// Print the report as JSON, with unrounded fractions.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("--keys must be from 1 to {MAX_KEYS}, got {0}")]
    Keys(u64),
    #[error("--nodes must be from 1 to {MAX_NODES}, got {0}")]
    Nodes(u32),
    #[error("{option} {value:?}: no such node (nodes are 0 … {last})")]
    NoSuchNode {
        option: &'static str,
        value: String,
        last: u32,
    },
    #[error("--remove needs at least 2 nodes")]
    RemoveLast,
    #[error("--weight {0:?}: expected NODE=W with W from 0 to {MAX_WEIGHT}, e.g. 3=2")]
    Weight(String),
    #[error("--weight given twice for node {0}")]
    WeightTwice(u32),
    #[error(
        "--hot {0:?}: expected FRACTION:FACTOR with 0 < FRACTION <= 1 and FACTOR >= 1, e.g. 0.01:100"
    )]
    Hot(String),
    #[error("--salt needs --hot")]
    SaltWithoutHot,
    #[error("--salt must be from 1 to {MAX_SALT}, got {0}")]
    Salt(u32),
    #[error("--replicas and --zones go together")]
    ReplicasWithoutZones,
    #[error("--replicas {replicas}: must be from 1 to the {nodes} weighted nodes")]
    Replicas { replicas: u32, nodes: usize },
    #[error(
        "--zones {zones}: {replicas} replicas in distinct zones need {replicas} zones holding weighted nodes, only {populated} do"
    )]
    Zones {
        zones: u32,
        replicas: u32,
        populated: usize,
    },
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("cannot write the report: {0}")]
    Output(#[from] std::io::Error),
    #[error("cannot encode the report: {0}")]
    Json(#[from] serde_json::Error),
}

/// `magpie simulate`: validate, run, print the table or JSON; warnings go to
/// stderr. A closed stdout (`| head`) ends the command quietly.
pub fn main(args: &SimulateArgs) -> Result<(), SimulateError> {
    let experiment = Experiment::from_args(args)?;
    let report = run(&experiment)?;
    let mut stderr = std::io::stderr().lock();
    for w in &report.warnings {
        writeln!(stderr, "warning: {w}")?;
    }
    let text = if args.json {
        let mut json = serde_json::to_string_pretty(&report)?;
        json.push('\n');
        json
    } else {
        render(&report)
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests;
