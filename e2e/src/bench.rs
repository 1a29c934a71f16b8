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
    // The directory's name, with or without a trailing slash.
    let plane = assets
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default();
    format!("{uname}, {cores} cores, control plane `{plane}`")
}

/// The cargo profile this benchmark was built with, for its results file.
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "dev profile"
    } else {
        "release profile"
    }
}

/// The median of `values` (the upper one of an even count); zero when empty.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The modes of round `round` in the order they run: mode `(round + i * step) mod n` runs `i`th,
/// the step cycling through the numbers coprime with `n` (1, 2, 3, 4 for five modes), so that
/// from round to round a mode runs at another position and after another mode. A phase can
/// inherit its predecessor's state (an API server's garbage collector paced for another
/// allocation rate; the benchmarks warm each phase up against that): a plain rotation kept the
/// cyclic order, so it handed each mode the same predecessor every round. Round 0 is `modes` as
/// given.
pub fn round_order<T: Copy>(modes: &[T], round: usize) -> impl Iterator<Item = T> + '_ {
    let n = modes.len().max(1);
    let steps: Vec<usize> = (1..n.max(2)).filter(|k| gcd(*k, n) == 1).collect();
    let step = steps[round % steps.len()];
    (0..modes.len()).map(move |i| modes[(round + i * step) % n])
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Each round's rate against the base's rate of the same round (both in round order).
pub fn per_round_ratios(rates: &[f64], base: &[f64]) -> Vec<f64> {
    rates.iter().zip(base).map(|(r, b)| r / b).collect()
}

/// Cumulative bucket counts of a histogram: (upper bound, count), ascending.
pub type Buckets = Vec<(f64, u64)>;

/// The buckets of histogram `name` in Prometheus text `text`, summed over every series (so
/// several processes' scrapes, concatenated, give one histogram).
pub fn histogram_buckets(text: &str, name: &str) -> Buckets {
    histogram_buckets_with(text, name, "")
}

/// The same, over the series whose labels contain `label` (such as `path="write"`).
pub fn histogram_buckets_with(text: &str, name: &str, label: &str) -> Buckets {
    let prefix = format!("{name}_bucket{{");
    let mut sums: Vec<(f64, u64)> = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
    {
        let Some((labels, value)) = line[prefix.len()..].split_once("} ") else {
            continue;
        };
        let bound = labels.split(',').find_map(|l| l.trim().strip_prefix("le=\""));
        let bound = match bound.map(|b| b.trim_end_matches('"')) {
            Some("+Inf") => f64::INFINITY,
            Some(b) => match b.parse::<f64>() {
                Ok(b) => b,
                Err(_) => continue,
            },
            None => continue,
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let count = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        match sums.iter_mut().find(|(b, _)| b.total_cmp(&bound).is_eq()) {
            Some(slot) => slot.1 += count,
            None => sums.push((bound, count)),
        }
    }
    sums.sort_by(|a, b| a.0.total_cmp(&b.0));
    sums
}

/// What a histogram observed between two snapshots of it. A series absent before (a labelled
/// one appears at its first observation) grew by all it holds.
pub fn growth(before: &[(f64, u64)], after: &[(f64, u64)]) -> Buckets {
    if before.is_empty() {
        return after.to_vec();
    }
    after
        .iter()
        .zip(before)
        .map(|((bound, a), (_, b))| (*bound, a.saturating_sub(*b)))
        .collect()
}

/// Adds `more` (same bounds) to `into`; an empty `into` becomes `more`.
pub fn add(into: &mut Buckets, more: &[(f64, u64)]) {
    if into.is_empty() {
        into.extend_from_slice(more);
    } else {
        for (slot, (_, n)) in into.iter_mut().zip(more) {
            slot.1 += n;
        }
    }
}

/// The `q` quantile of what `buckets` counted, interpolated linearly within its bucket (as
/// Prometheus' `histogram_quantile` does); zero when nothing was counted.
#[allow(clippy::cast_precision_loss)]
pub fn histogram_quantile(buckets: &[(f64, u64)], q: f64) -> f64 {
    let total = buckets.last().map_or(0, |d| d.1);
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, count) in buckets {
        if count as f64 >= rank {
            if bound.is_infinite() {
                return lower.0;
            }
            let in_bucket = (count - lower.1) as f64;
            let fraction = if in_bucket > 0.0 {
                (rank - lower.1 as f64) / in_bucket
            } else {
                1.0
            };
            return lower.0 + (bound - lower.0) * fraction;
        }
        lower = (bound, count);
    }
    lower.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_runs_every_mode_once_at_a_moving_start_after_changing_predecessors() {
        let modes = ['a', 'b', 'c', 'd', 'e'];
        let rounds: Vec<String> = (0..5).map(|r| round_order(&modes, r).collect()).collect();
        assert_eq!(rounds, ["abcde", "bdace", "cadbe", "dcbae", "eabcd"]);
        for round in &rounds {
            let mut sorted: Vec<char> = round.chars().collect();
            sorted.sort_unstable();
            assert_eq!(sorted, modes);
        }
        // Within four rounds every mode has run right after at least three different modes
        // (a rotation gives each exactly one).
        for mode in modes {
            let mut before: Vec<char> = rounds[..4]
                .iter()
                .filter_map(|r| {
                    let i = r.find(mode)?;
                    r[..i].chars().last()
                })
                .collect();
            before.sort_unstable();
            before.dedup();
            assert!(before.len() >= 3, "{mode} ran only after {before:?}");
        }
        let four: Vec<String> = (0..4)
            .map(|r| round_order(&['a', 'b', 'c', 'd'], r).collect())
            .collect();
        assert_eq!(four, ["abcd", "badc", "cdab", "dcba"]);
        assert_eq!(round_order::<char>(&[], 3).count(), 0);
        assert_eq!(round_order(&['a'], 3).collect::<String>(), "a");
        assert_eq!(per_round_ratios(&[2.0, 3.0, 9.0], &[4.0, 3.0]), [0.5, 1.0]);
    }

    #[test]
    fn histograms_from_several_scrapes() {
        let text = "# HELP x_seconds x\n\
                    x_seconds_bucket{le=\"0.001\"} 2\n\
                    x_seconds_bucket{le=\"0.01\"} 8\n\
                    x_seconds_bucket{le=\"+Inf\"} 10\n\
                    x_seconds_count 10\n\
                    other_bucket{le=\"0.001\"} 99\n\
                    x_seconds_bucket{le=\"0.001\"} 0\n\
                    x_seconds_bucket{le=\"0.01\"} 2\n\
                    x_seconds_bucket{le=\"+Inf\"} 2\n";
        let b = histogram_buckets(text, "x_seconds");
        assert_eq!(b, vec![(0.001, 2), (0.01, 10), (f64::INFINITY, 12)]);
        // 12 observed: the median (rank 6) lies in (0.001, 0.01], 4 of its 8.
        let median = histogram_quantile(&b, 0.5);
        assert!((median - (0.001 + 0.009 * 0.5)).abs() < 1e-9, "{median}");
        // Above the last finite bound: that bound, not infinity.
        assert!((histogram_quantile(&b, 0.99) - 0.01).abs() < 1e-9);
        let mut grown = Buckets::new();
        add(
            &mut grown,
            &growth(&[(0.001, 1), (0.01, 1)], &[(0.001, 3), (0.01, 4)]),
        );
        add(
            &mut grown,
            &growth(&[(0.001, 0), (0.01, 0)], &[(0.001, 1), (0.01, 1)]),
        );
        assert_eq!(grown, vec![(0.001, 3), (0.01, 4)]);
        assert!(histogram_quantile(&[], 0.5).abs() < f64::EPSILON);
    }

    #[test]
    fn labelled_series_and_series_that_appear() {
        let text = "y_bucket{path=\"write\",le=\"0.1\"} 3\n\
                    y_bucket{path=\"write\",le=\"+Inf\"} 4\n\
                    y_bucket{path=\"allotment\",le=\"0.1\"} 7\n\
                    y_bucket{path=\"allotment\",le=\"+Inf\"} 7\n";
        let write = histogram_buckets_with(text, "y", "path=\"write\"");
        assert_eq!(write, vec![(0.1, 3), (f64::INFINITY, 4)]);
        assert_eq!(histogram_buckets(text, "y"), vec![(0.1, 10), (f64::INFINITY, 11)]);
        // Not there at the first scrape: all it holds is growth.
        assert_eq!(growth(&[], &write), write);
    }

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
