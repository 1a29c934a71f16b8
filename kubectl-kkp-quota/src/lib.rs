//! `kubectl kkp-quota`: a project's quota, read where people work.
//!
//! - `status`: in a user cluster, its project's `QuotaView` (limits, use, room, each cluster's
//!   use); on the master, every `ProjectQuota` with its seeds, stale ones and stuck shares.
//! - `fits -f FILE`: how many Machines of each size in the file fit now, sized by provider-sizes
//!   exactly as the webhook sizes them, and which limit stops the rest. Exits 1 when something
//!   in the file does not fit.
//! - `top`: the master's projects by how much of their quota they use.
//!
//! [`read`] does the reading; every answer is a pure function of what was read ([`status`],
//! [`fits`], [`top`]); [`output`] prints it as a table, JSON or YAML.

pub mod args;
pub mod error;
pub mod fits;
#[cfg(test)]
mod fixtures;
pub mod output;
pub mod read;
pub mod status;
pub mod table;
pub mod top;

pub use args::{Args, Command, Format};
pub use error::Error;

/// What a command printed, and whether everything it was asked about fits (only `fits` can say
/// no).
#[derive(Debug)]
pub struct Outcome {
    pub text: String,
    pub all_fit: bool,
}

impl Outcome {
    /// 0, or 1 when `fits` found something that does not fit (errors exit 2).
    pub fn exit_code(&self) -> std::process::ExitCode {
        if self.all_fit {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::from(1)
        }
    }
}

/// Runs one command against the cluster the kubeconfig names.
pub async fn run(args: &Args) -> Result<Outcome, Error> {
    let client = read::client(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let quotas = read::quotas(&client).await?;
    let now = jiff::Timestamp::now();
    match &args.command {
        Command::Status { project } => {
            let report = status::report(&quotas, project.as_deref(), now)?;
            Ok(Outcome {
                text: output::render(&report, args.output, status::table)?,
                all_fit: true,
            })
        }
        Command::Fits {
            filename,
            project,
            catalog,
        } => {
            let text = read::file(filename)?;
            let catalog = read::catalog(catalog.as_deref())?;
            let asked = fits::parse(&text)?;
            let room = fits::room(&quotas, project.as_deref())?;
            let report = fits::report(&asked, &room, &catalog);
            Ok(Outcome {
                all_fit: report.all_fit(),
                text: output::render(&report, args.output, fits::table)?,
            })
        }
        Command::Top { resource } => {
            let report = top::report(&quotas, *resource)?;
            Ok(Outcome {
                text: output::render(&report, args.output, top::table)?,
                all_fit: true,
            })
        }
    }
}
