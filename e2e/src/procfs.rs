//! Facts about processes from `/proc` (Linux), for teardown tests and memory measurements.

use std::path::Path;

/// The number in `field` of a `status` file (`/proc/<pid>/status` or a thread's), `None` if the
/// process is gone.
fn status_number(file: &Path, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(file).ok()?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    line.split_whitespace().next()?.parse().ok()
}

/// A `kB` field of `/proc/<pid>/status` in bytes, `None` if the process is gone.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    Some(status_number(Path::new(&format!("/proc/{pid}/status")), field)? * 1024)
}

/// The fields of a `stat` file after the parenthesised command name (which may hold spaces):
/// state first, then the parent, ...
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat.rsplit_once(')')?.1.split_whitespace().collect())
}

/// The state letter of a `stat` file (`R`, `S`, `T`, `Z`, ...).
fn state(stat: &str) -> Option<char> {
    stat_fields(stat)?.first()?.chars().next()
}

/// The directories of `pid`'s threads (`/proc/<pid>/task/*`); none if it is gone.
fn threads(pid: u32) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| tasks.filter_map(|t| Some(t.ok()?.path())).collect())
        .unwrap_or_default()
}

/// Resident memory of a process in bytes (`VmRSS`), `None` if it is gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS")
}

/// Peak resident memory of a process in bytes (`VmHWM`), `None` if it is gone.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM")
}

/// CPU time (user + system) a process has used, in clock ticks (`/proc/<pid>/stat`; `self`
/// for this process), `None` if it is gone.
pub fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let fields = stat_fields(&stat)?;
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// CPU ticks [`cpu_ticks`] of every process in `pids` together; a process gone counts 0.
pub fn total_cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter().map(|p| cpu_ticks(&p.to_string()).unwrap_or(0)).sum()
}

/// Clock ticks the whole machine has spent busy, and in all, summed over its CPUs since boot
/// (`/proc/stat`: busy is everything but idle and iowait).
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find_map(|l| l.strip_prefix("cpu "))?;
    // user nice system idle iowait irq softirq steal; guest time is inside user already.
    let fields: Vec<u64> = line
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3)? + fields.get(4)?;
    Some((total - idle, total))
}

/// CPU ticks used so far by groups of processes, by this process, and by the whole machine:
/// take one before and one after, and [`since`](Self::since) is what each used in between.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    /// Per group, in the order given to [`now`](Self::now) (a process gone counts 0).
    pub groups: Vec<u64>,
    pub this_process: u64,
    /// [`machine_ticks`]: busy, and all (idle included).
    pub machine_busy: u64,
    pub machine_total: u64,
}

impl CpuTicks {
    pub fn now(groups: &[Vec<u32>]) -> CpuTicks {
        let (machine_busy, machine_total) = machine_ticks().unwrap_or_default();
        CpuTicks {
            groups: groups.iter().map(|pids| total_cpu_ticks(pids)).collect(),
            this_process: cpu_ticks("self").unwrap_or(0),
            machine_busy,
            machine_total,
        }
    }

    /// Group `i`'s ticks (0 for a group it does not have, as in an empty sum).
    pub fn group(&self, i: usize) -> u64 {
        self.groups.get(i).copied().unwrap_or(0)
    }

    /// A results table's cells for CPU ms per create, `creates` of them: all groups and this
    /// process together, then each group, then this process (`| `-separated, two decimals).
    pub fn per_create_row(&self, ticks_per_second: f64, creates: usize) -> String {
        #[allow(clippy::cast_precision_loss)]
        let per_create = |ticks: u64| ticks as f64 / ticks_per_second * 1000.0 / creates.max(1) as f64;
        let all = self.groups.iter().sum::<u64>() + self.this_process;
        std::iter::once(all)
            .chain(self.groups.iter().copied())
            .chain([self.this_process])
            .map(|t| format!("{:.2}", per_create(t)))
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// What was used from `before` until this one.
    #[must_use]
    pub fn since(&self, before: &CpuTicks) -> CpuTicks {
        CpuTicks {
            groups: self
                .groups
                .iter()
                .zip(before.groups.iter().chain(std::iter::repeat(&0)))
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
            this_process: self.this_process.saturating_sub(before.this_process),
            machine_busy: self.machine_busy.saturating_sub(before.machine_busy),
            machine_total: self.machine_total.saturating_sub(before.machine_total),
        }
    }

    /// Adds `more` (the same groups) to this one.
    pub fn add(&mut self, more: &CpuTicks) {
        if self.groups.len() < more.groups.len() {
            self.groups.resize(more.groups.len(), 0);
        }
        for (sum, n) in self.groups.iter_mut().zip(&more.groups) {
            *sum += n;
        }
        self.this_process += more.this_process;
        self.machine_busy += more.machine_busy;
        self.machine_total += more.machine_total;
    }
}

/// How the scheduler treated a group of processes so far, summed over their threads
/// (`/proc/<pid>/task/*`): time runnable but waiting for a CPU (`schedstat`'s run delay), and how
/// often a thread was switched out while it still wanted to run (`nonvoluntary_ctxt_switches`).
/// Take one before and one after; [`since`](Self::since) is what happened in between (a thread
/// that exited meanwhile is missed; Go's threads rarely do).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scheduling {
    pub run_delay_ns: u64,
    pub preempted: u64,
}

impl Scheduling {
    pub fn now(pids: &[u32]) -> Scheduling {
        let mut sum = Scheduling::default();
        for dir in pids.iter().flat_map(|pid| threads(*pid)) {
            // schedstat: time on a CPU, time waiting for one, timeslices.
            let delay = std::fs::read_to_string(dir.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok());
            sum.run_delay_ns += delay.unwrap_or(0);
            sum.preempted += status_number(&dir.join("status"), "nonvoluntary_ctxt_switches").unwrap_or(0);
        }
        sum
    }

    #[must_use]
    pub fn since(&self, before: &Scheduling) -> Scheduling {
        Scheduling {
            run_delay_ns: self.run_delay_ns.saturating_sub(before.run_delay_ns),
            preempted: self.preempted.saturating_sub(before.preempted),
        }
    }

    pub fn add(&mut self, more: &Scheduling) {
        self.run_delay_ns += more.run_delay_ns;
        self.preempted += more.preempted;
    }
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, the Linux value, if it cannot be asked).
pub fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU time (user + system) a process has used, in seconds.
#[allow(clippy::cast_precision_loss)]
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    Some(cpu_ticks(&pid.to_string())? as f64 / ticks_per_second())
}

/// Whether `pid` is a live (not zombie) process. A reaped process has no `/proc/<pid>`.
pub fn is_running(pid: u32) -> bool {
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| state(&stat))
        .is_some_and(|state| !matches!(state, 'Z' | 'X'))
}

/// Whether every thread of `pid` is stopped (state `T` in `/proc/<pid>/task/*/stat`, as after
/// SIGSTOP); false if it is gone.
pub fn is_stopped(pid: u32) -> bool {
    let states: Vec<Option<char>> = threads(pid)
        .iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("stat")).ok())
        .map(|stat| state(&stat))
        .collect();
    !states.is_empty() && states.iter().all(|s| *s == Some('T'))
}

/// The live children of `pid` (processes whose parent is `pid`).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|candidate| parent(*candidate) == Some(pid))
        .collect()
}

/// The parent of `pid`, from `/proc/<pid>/stat`.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the state: the parent.
    stat_fields(&stat)?.get(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_ticks_are_read_and_grow() {
        let (busy, total) = machine_ticks().expect("/proc/stat");
        assert!(busy <= total && total > 0, "{busy} of {total}");
        let own = cpu_ticks("self").expect("own stat");
        // Spin until this process has used a tick more: the machine was busy meanwhile. The
        // machine's counters can lag the process's by a tick on a VM, so spin on (bounded) until
        // they show it too.
        while cpu_ticks("self").expect("own stat") < own + 2 {}
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (mut busy_after, mut total_after) = machine_ticks().expect("/proc/stat");
        while (busy_after <= busy || total_after <= total) && std::time::Instant::now() < deadline {
            (busy_after, total_after) = machine_ticks().expect("/proc/stat");
        }
        assert!(
            busy_after > busy && total_after > total,
            "busy {busy} -> {busy_after}, total {total} -> {total_after}"
        );
    }

    #[test]
    fn more_spinning_threads_than_cores_are_preempted_and_wait() {
        let me = [std::process::id()];
        let before = Scheduling::now(&me);
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // Twice as many spinning threads as cores, until the scheduler has had to preempt them and
        // make them wait. The sums are over the whole test process, whose other tests' threads
        // come and go (a thread that exits takes its counts with it), so wait for both figures
        // rather than stop at the first preemption.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..2 * cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || while !stop.load(std::sync::atomic::Ordering::Relaxed) {})
            })
            .collect();
        let waited = |d: &Scheduling| d.preempted > 0 && d.run_delay_ns > 0;
        while !waited(&Scheduling::now(&me).since(&before)) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let during = Scheduling::now(&me).since(&before);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spinners {
            s.join().expect("spinner");
        }
        assert!(waited(&during), "{during:?}");
        assert_eq!(
            Scheduling::now(&[u32::MAX]),
            Scheduling::default(),
            "no such process"
        );
        let mut sum = Scheduling::default();
        sum.add(&during);
        assert_eq!(sum.since(&during), Scheduling::default());
    }

    #[test]
    fn a_stopped_process_is_seen_stopped_and_a_running_one_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        assert!(!is_stopped(pid));
        let kill = |signal: &str| {
            std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .expect("kill")
        };
        assert!(kill("-STOP").success());
        crate::wait::wait_until_blocking(std::time::Duration::from_secs(10), "sleep stopped", || {
            is_stopped(pid)
        })
        .expect("stopped");
        assert!(kill("-CONT").success());
        child.kill().expect("kill sleep");
        child.wait().expect("reap sleep");
        assert!(!is_stopped(pid), "a reaped process is not stopped");
    }

    #[test]
    fn cpu_ticks_between_two_samples_add_up() {
        let before = CpuTicks::now(&[vec![std::process::id()], vec![]]);
        let own = before.this_process;
        while cpu_ticks("self").expect("own stat") < own + 2 {}
        let used = CpuTicks::now(&[vec![std::process::id()], vec![]]).since(&before);
        assert!(used.groups[0] >= 2 && used.this_process >= 2, "{used:?}");
        assert_eq!(used.groups[1], 0, "an empty group uses nothing");
        assert!(used.machine_busy > 0 && used.machine_total >= used.machine_busy);
        let mut sum = CpuTicks::default();
        sum.add(&used);
        sum.add(&used);
        assert_eq!(sum.groups, vec![2 * used.groups[0], 0]);
        assert_eq!(sum.this_process, 2 * used.this_process);
    }
}
