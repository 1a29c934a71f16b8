//! What a node changes on the machine outside its own directory, read before it starts and put
//! back after it stops: kubelet, containerd, the CNI plugins and kube-proxy write machine-wide
//! state (addresses, links, iptables, sysctls, mounts, cgroups, fixed paths) that a test must not
//! leave behind for the next one, or for the next CI job on the same machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// sysctls something on the node sets: the bridge plugin (`isGateway` turns on forwarding),
/// kubelet's kernel tunables (it sets them unless `protectKernelDefaults`, which would refuse to
/// start on a machine that has other values), kube-proxy's localhost routing.
const SYSCTLS: [&str; 8] = [
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Fixed paths that kubelet, containerd's shims and CNI create whatever they are configured with:
/// kubelet's container log links, the shims' sockets, network namespaces, the CNI result cache.
pub const FIXED_PATHS: [&str; 6] = [
    "/var/log/containers",
    "/var/log/pods",
    "/run/containerd",
    "/run/netns",
    "/var/lib/cni",
    "/opt/containerd",
];

/// Names of the node's processes (a pod's own processes live in its cgroups, counted there).
const PROCESS_NAMES: [&str; 6] = [
    "containerd",
    "containerd-shim",
    "containerd-shim-runc-v2",
    "kubelet",
    "kube-proxy",
    "kube-scheduler",
];

/// The iptables tables kube-proxy and the CNI plugins write.
const TABLES: [&str; 4] = ["filter", "nat", "mangle", "raw"];

/// The machine-wide state a node may change, as text that compares equal when nothing changed.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct HostSnapshot {
    addresses: Vec<String>,
    links: Vec<String>,
    iptables: Vec<String>,
    ip6tables: Vec<String>,
    /// `iptables-save` and `ip6tables-save` as they were, to put back with `*-restore`.
    saved_tables: (String, String),
    sysctls: BTreeMap<String, String>,
    mounts: Vec<String>,
    cgroups: Vec<String>,
    paths: Vec<String>,
    processes: Vec<String>,
}

impl HostSnapshot {
    /// Reads the state now.
    pub fn take() -> Result<HostSnapshot> {
        Ok(HostSnapshot {
            addresses: addresses()?,
            links: link_names()?,
            iptables: rules(&run("iptables-save", &[])?),
            ip6tables: rules(&run("ip6tables-save", &[])?),
            saved_tables: (run("iptables-save", &[])?, run("ip6tables-save", &[])?),
            sysctls: SYSCTLS
                .iter()
                .filter_map(|s| {
                    let value = std::fs::read_to_string(Path::new("/proc/sys").join(s)).ok()?;
                    Some(((*s).to_owned(), value.trim().to_owned()))
                })
                .collect(),
            mounts: mount_points()?,
            cgroups: kubepods_cgroups(),
            paths: FIXED_PATHS
                .iter()
                .filter(|p| Path::new(p).exists())
                .map(|p| (*p).to_owned())
                .collect(),
            processes: all_pids()
                .into_iter()
                .filter(|pid| is_live(*pid))
                .filter_map(|pid| {
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                    let comm = comm.trim();
                    PROCESS_NAMES.contains(&comm).then(|| format!("{comm} ({pid})"))
                })
                .collect(),
        })
    }

    /// What differs in `after`, one line each, empty when the machine is as it was.
    pub fn differences(&self, after: &HostSnapshot) -> Vec<String> {
        let mut out = Vec::new();
        let mut list = |what: &str, before: &[String], now: &[String]| {
            out.extend(
                now.iter()
                    .filter(|x| !before.contains(x))
                    .map(|x| format!("{what} added: {x}")),
            );
            out.extend(
                before
                    .iter()
                    .filter(|x| !now.contains(x))
                    .map(|x| format!("{what} gone: {x}")),
            );
        };
        list("address", &self.addresses, &after.addresses);
        list("link", &self.links, &after.links);
        list("iptables", &self.iptables, &after.iptables);
        list("ip6tables", &self.ip6tables, &after.ip6tables);
        list("mount", &self.mounts, &after.mounts);
        list("cgroup", &self.cgroups, &after.cgroups);
        list("path", &self.paths, &after.paths);
        list("process", &self.processes, &after.processes);
        for (name, value) in &self.sysctls {
            let now = after.sysctls.get(name).map_or("(unreadable)", String::as_str);
            if now != value {
                out.push(format!("sysctl {name}: {value} -> {now}"));
            }
        }
        out
    }

    /// Puts back what a node changed: every step runs even when one before it failed (the
    /// errors are joined), in an order where nothing still running can re-create what a step
    /// removed. The node's own processes must be gone already, except the pods' and shims',
    /// which this kills.
    pub fn restore(&self, node_dir: &Path) -> Result<()> {
        let mut errors = Vec::new();
        let mut step = |what: &str, result: Result<()>| {
            if let Err(e) = result {
                errors.push(format!("{what}: {e:#}"));
            }
        };
        step("killing pods and shims", kill_pods_and_shims(node_dir));
        step("unmounting", self.unmount());
        step("removing cgroups", self.remove_cgroups());
        step("removing links", self.remove_links());
        step("iptables", restore_tables("iptables", &self.saved_tables.0));
        step("ip6tables", restore_tables("ip6tables", &self.saved_tables.1));
        step("sysctls", self.restore_sysctls());
        step("addresses", self.remove_addresses());
        step("paths", self.remove_paths());
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("{}", errors.join("; "))
        }
    }

    fn unmount(&self) -> Result<()> {
        // Deepest first, so a mount on top of another goes before it.
        let mut added: Vec<String> = mount_points()?
            .into_iter()
            .filter(|m| !self.mounts.contains(m))
            .collect();
        added.sort_by_key(|m| std::cmp::Reverse(m.len()));
        let mut failed = Vec::new();
        for point in added {
            // Lazy: a mount a dying process still holds goes when it lets go.
            if run("umount", &["-l", &point]).is_err() {
                failed.push(point);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            bail!("could not unmount {}", failed.join(", "))
        }
    }

    fn remove_cgroups(&self) -> Result<()> {
        // A killed process leaves its cgroup a moment after the signal: retry until the deadline.
        let removed = crate::wait::poll_blocking(Duration::from_secs(5), || {
            let mut left = kubepods_cgroups();
            left.retain(|c| !self.cgroups.contains(c));
            // Deepest first: a cgroup with children cannot be removed.
            left.sort_by_key(|c| std::cmp::Reverse(c.matches('/').count()));
            for cgroup in &left {
                let _ = std::fs::remove_dir(cgroup);
            }
            left.is_empty()
        });
        if removed {
            Ok(())
        } else {
            bail!("cgroups left: {}", kubepods_cgroups().join(", "))
        }
    }

    fn remove_links(&self) -> Result<()> {
        for link in link_names()? {
            if !self.links.contains(&link) {
                // A veth goes with its peer; deleting one already gone is no error worth keeping.
                let _ = run("ip", &["link", "del", &link]);
            }
        }
        let left: Vec<String> = link_names()?
            .into_iter()
            .filter(|l| !self.links.contains(l))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            bail!("links left: {}", left.join(", "))
        }
    }

    fn restore_sysctls(&self) -> Result<()> {
        for (name, value) in &self.sysctls {
            let path = Path::new("/proc/sys").join(name);
            let now = std::fs::read_to_string(&path).unwrap_or_default();
            if now.trim() != value {
                std::fs::write(&path, value).with_context(|| format!("writing {}", path.display()))?;
            }
        }
        Ok(())
    }

    fn remove_addresses(&self) -> Result<()> {
        let now = addresses()?;
        for address in now.iter().filter(|a| !self.addresses.contains(a)) {
            // "lo inet 10.99.0.1/32"
            let parts: Vec<&str> = address.split_whitespace().collect();
            if let [dev, _, cidr] = parts[..] {
                run("ip", &["addr", "del", cidr, "dev", dev])?;
            }
        }
        Ok(())
    }

    fn remove_paths(&self) -> Result<()> {
        for path in FIXED_PATHS {
            if !self.paths.iter().any(|p| p == path) && Path::new(path).exists() {
                std::fs::remove_dir_all(path).with_context(|| format!("removing {path}"))?;
            }
        }
        Ok(())
    }
}

/// SIGKILL to every process in the node's cgroups (the pods' containers), and to every process
/// whose command line names the node's directory: its own (left running when a test process
/// was killed before its teardown) and containerd's shims (they outlive containerd, re-parented
/// to init). Until none is left: a kubelet or containerd killed in the same pass may have
/// started a shim after the listing.
fn kill_pods_and_shims(node_dir: &Path) -> Result<()> {
    let marker = node_dir.display().to_string();
    for _ in 0..20 {
        let mut pids: Vec<u32> = kubepods_cgroups()
            .iter()
            .filter_map(|c| std::fs::read_to_string(Path::new(c).join("cgroup.procs")).ok())
            .flat_map(|procs| {
                procs
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        for pid in all_pids() {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if pid != std::process::id() && String::from_utf8_lossy(&cmdline).contains(&marker) {
                pids.push(pid);
            }
        }
        pids.retain(|pid| is_live(*pid));
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            return Ok(());
        }
        let args: Vec<String> = std::iter::once("-KILL".to_owned())
            .chain(pids.iter().map(ToString::to_string))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Some may have exited since they were listed: that is what we wanted.
        let _ = run("kill", &args);
        // Gone before the next pass lists again (one that is not is listed again).
        crate::wait::poll_blocking(Duration::from_secs(5), || !pids.iter().any(|pid| is_live(*pid)));
    }
    bail!("node processes still running after 20 rounds of SIGKILL")
}

/// The machine's addresses, one `"<device> <family> <address>/<prefix>"` each
/// (`ip -o addr show`: "1: lo    inet 127.0.0.1/8 scope host lo ..." -> "lo inet 127.0.0.1/8").
fn addresses() -> Result<Vec<String>> {
    Ok(lines(&run("ip", &["-o", "addr", "show"])?)
        .map(|l| l.split_whitespace().skip(1).take(3).collect::<Vec<_>>().join(" "))
        .collect())
}

/// Whether `pid` runs: a zombie holds nothing but its entry, until this machine's init (which
/// is no systemd) gets round to reaping it.
fn is_live(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(") ")
            .next()
            .is_some_and(|rest| !rest.starts_with('Z'))
    })
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every cgroup directory named `kubepods*` or below one, in every v1 hierarchy.
fn kubepods_cgroups() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.push(path.display().to_string());
                walk(&path, out);
            }
        }
    }
    let mut out = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    for hierarchy in hierarchies.flatten() {
        let Ok(children) = std::fs::read_dir(hierarchy.path()) else {
            continue;
        };
        for child in children.flatten() {
            let path: PathBuf = child.path();
            if child.file_name().to_string_lossy().starts_with("kubepods") && path.is_dir() {
                out.push(path.display().to_string());
                walk(&path, &mut out);
            }
        }
    }
    out.sort();
    out
}

fn mount_points() -> Result<Vec<String>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    // Field 5 is the mount point; several mounts on one point count once each.
    Ok(lines(&info)
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .collect())
}

fn link_names() -> Result<Vec<String>> {
    Ok(lines(&run("ip", &["-o", "link", "show"])?)
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .collect())
}

/// The rules and user chains of every table in `iptables-save` output, without counters: a table
/// that exists only because something listed it, with empty built-in chains, reads the same as
/// one never loaded.
fn rules(saved: &str) -> Vec<String> {
    let mut table = "";
    let mut out = Vec::new();
    for line in lines(saved) {
        if let Some(name) = line.strip_prefix('*') {
            table = name;
        } else if line.starts_with("-A ") {
            out.push(format!("{table} {line}"));
        } else if let Some(chain) = line.strip_prefix(':') {
            let mut parts = chain.split_whitespace();
            let (name, policy) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if policy != "ACCEPT" {
                out.push(format!("{table} chain {name} {policy}"));
            }
        }
    }
    out
}

/// Flushes and deletes every chain of every table, then puts back `saved` (`*-save` output from
/// before the node: the machine's own rules, when it had any).
fn restore_tables(tool: &str, saved: &str) -> Result<()> {
    for table in TABLES {
        // Listing a table the kernel never loaded loads it, empty: nothing is lost.
        let _ = run(tool, &["-t", table, "-F"]);
        let _ = run(tool, &["-t", table, "-X"]);
    }
    if lines(saved).next().is_none() {
        return Ok(());
    }
    let mut child = Command::new(format!("{tool}-restore"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {tool}-restore"))?;
    std::io::Write::write_all(&mut child.stdin.take().context("stdin")?, saved.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        bail!("{tool}-restore failed ({status})");
    }
    Ok(())
}

fn lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// Runs a command, its stdout on success, its stderr in the error otherwise.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
