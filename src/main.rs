//! The `magpie` command line. `anyhow` lives here only.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "magpie",
    version,
    about = "A Layer-4 consistent-hash TCP load balancer"
)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    Cli::parse();
    Ok(())
}
