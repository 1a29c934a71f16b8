//! Writes every CRD manifest under `deploy/crds/` (or checks that they are up to date).
//!
//! ```text
//! crdgen [--check] [--out DIR]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Write (or check) the CRD manifests generated from the Rust types")]
struct Args {
    /// Directory the manifests go to.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds"))]
    out: PathBuf,
    /// Do not write: fail if any committed manifest differs from the generated one.
    #[arg(long)]
    check: bool,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let mut drifted = Vec::new();
    for file in kkp_quota_crds::crd::all() {
        let path = args.out.join(file.path);
        let yaml = kkp_quota_crds::crd::to_yaml(&file)?;
        if args.check {
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != yaml {
                drifted.push(path.display().to_string());
            }
        } else {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    if drifted.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("CRD manifests differ from the Rust types; run `cargo run -p kkp-quota-crds --bin crdgen`:");
    for path in drifted {
        eprintln!("  {path}");
    }
    Ok(ExitCode::FAILURE)
}
