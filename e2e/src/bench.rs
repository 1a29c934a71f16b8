//! Small statistics the benchmarks (the examples of every crate) share, so their results
//! files compute percentiles and rates the same way.

use std::time::Duration;

/// The `p` quantile (0..=1) of `sorted` by the nearest index (`(n - 1) * p`, rounded); zero
/// when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// `d` in milliseconds with one decimal: "12.3 ms".
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// `n` per second of `d`.
#[allow(clippy::cast_precision_loss)]
pub fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// `bytes` in MiB.
#[allow(clippy::cast_precision_loss)]
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Where a benchmark ran, for its results file: kernel and architecture, cores, and the control
/// plane in use (`KUBEBUILDER_ASSETS`' last path component), e.g.
/// "`Linux 6.18 x86_64`, 2 cores, control plane `kube-v1.36.3_etcd-v3.6.16`".
pub fn host() -> String {
    let uname = std::process::Command::new("uname")
        .arg("-srm")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let assets = std::env::var("KUBEBUILDER_ASSETS").unwrap_or_default();
    let plane = assets.rsplit('/').next().unwrap_or_default();
    format!("{uname}, {cores} cores, control plane `{plane}`")
}

/// The median of `values` (the upper one of an even count); zero when empty.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_medians() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&d, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
        assert!((median(vec![3.0, 1.0, 2.0]) - 2.0).abs() < f64::EPSILON);
        assert_eq!(ms(Duration::from_micros(12_345)), "12.3 ms");
        assert!((rate(10, Duration::from_secs(2)) - 5.0).abs() < f64::EPSILON);
    }
}
