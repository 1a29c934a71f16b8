//! The command line. kubectl hands a plugin none of its own flags, so the kubeconfig and context
//! are flags here too (or `KUBECONFIG`, as for kubectl).

// The doc comments are the `--help` text, written for people, not rustdoc.
#![allow(clippy::doc_markdown)]

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use kkp_quota_crds::Resource;

#[derive(Parser, Debug)]
#[command(
    name = "kubectl kkp-quota",
    bin_name = "kubectl kkp-quota",
    version,
    about = "A project's quota: what is used, what is free, and what fits",
    after_help = "In a user cluster it reads the project's QuotaView; on the master (for admins) every ProjectQuota."
)]
pub struct Args {
    /// The kubeconfig to read (default: KUBECONFIG, then ~/.kube/config, as kubectl).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// How to print the answer.
    #[arg(short, long, value_enum, default_value_t = Format::Table, global = true)]
    pub output: Format,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The limits in force, what is used and what is free.
    Status {
        /// Only this project (on the master; a user cluster shows its own project).
        #[arg(long)]
        project: Option<String>,
    },
    /// How many Machines of each size in a file fit now
    ///
    /// Reads Machines, MachineSets and MachineDeployments, or a List of them (`-f -` reads
    /// standard input), sizes each as the admission webhook does, and says which limit stops the
    /// rest. Exits 1 when something does not fit. For a MachineDeployment that exists already,
    /// its running Machines are counted as used: compare the room with the replicas you add.
    Fits {
        /// The manifest (YAML or JSON, several documents allowed).
        #[arg(short = 'f', long)]
        filename: PathBuf,
        /// The project to check against (needed on the master).
        #[arg(long)]
        project: Option<String>,
        /// The admin size catalog the seed's webhook uses (the text of its ConfigMap entry), for
        /// flavours that only it defines.
        #[arg(long)]
        catalog: Option<PathBuf>,
    },
    /// Projects by how much of their quota they use, fullest first (on the master).
    Top {
        /// Order by this resource alone (default: each project's fullest resource).
        #[arg(long, value_parser = parse_resource)]
        resource: Option<Resource>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

fn parse_resource(name: &str) -> Result<Resource, String> {
    Resource::ALL
        .iter()
        .copied()
        .find(|r| r.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Resource::ALL.iter().map(|r| r.name()).collect();
            format!("unknown resource {name:?}; one of {}", names.join(", "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_after_the_subcommand_and_a_resource_by_name() {
        let args = Args::try_parse_from(["kubectl-kkp_quota", "top", "--resource", "memory", "-o", "json"])
            .expect("parses");
        assert_eq!(args.output, Format::Json);
        assert!(matches!(
            args.command,
            Command::Top {
                resource: Some(Resource::Memory)
            }
        ));
        let wrong = Args::try_parse_from(["kubectl-kkp_quota", "top", "--resource", "ram"])
            .expect_err("ram is no resource");
        assert!(wrong.to_string().contains("one of cpu"), "{wrong}");
    }
}
