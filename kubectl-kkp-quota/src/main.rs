//! `kubectl kkp-quota`: see the library's documentation.

use clap::Parser;
use kubectl_kkp_quota::{Args, run};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(outcome) => {
            print!("{}", outcome.text);
            outcome.exit_code()
        }
        Err(e) => {
            eprintln!("error: {}", e.chain());
            std::process::ExitCode::from(2)
        }
    }
}
