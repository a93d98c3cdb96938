//! The `magpie` command line. `anyhow` lives here only.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "magpie",
    version,
    about = "A Layer-4 consistent-hash TCP load balancer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure how hashing schemes move keys and balance load when a pool changes.
    Simulate(magpie::simulate::SimulateArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => magpie::simulate::main(&args)?,
    }
    Ok(())
}
