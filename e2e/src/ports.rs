//! Loopback ports for the processes tests start.
//!
//! A port found by binding port 0 comes from the kernel's ephemeral range, the same range every
//! outgoing connection takes its local port from. Between our release of it and the child's
//! bind, one of the many client connections a fleet opens can take it, and the child exits with
//! "address already in use". Ports below that range are never handed out by the kernel, so only
//! another explicit bind can take one. Within this process none is handed out twice, and across
//! the test processes of one machine (`make test` runs several side by side) each port handed
//! out is claimed by a locked file under [`CLAIMS_DIR`] for as long as its process lives: two
//! processes walking the same ports once handed out the same one, and the second child to bind
//! it failed.

use std::collections::HashSet;
use std::fs::{File, TryLockError};
use std::net::TcpListener;
use std::ops::Range;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::{Mutex, PoisonError};

use anyhow::{Context as _, Result};

/// The lowest port tried below the ephemeral range.
const LOWEST: u16 = 20_000;
/// The smallest gap below the ephemeral range worth using.
const MIN_SPAN: u16 = 1_000;
/// One file per port handed out, locked by the process that holds it. The kernel drops the lock
/// when that process ends, however it ends, so nothing stale is left to clean up.
const CLAIMS_DIR: &str = "/tmp/kkp-quota-ports";

/// Whether this process may hand out a port, as far as the other processes are concerned.
enum Claim {
    /// Ours until this process ends (the lock lives as long as the file stays open).
    Held(File),
    /// Another live process holds it.
    TakenElsewhere,
    /// No claim could be made (no claims directory, or no file descriptor left): the bind
    /// check alone decides, as before claims existed.
    Unavailable,
}

fn claim(port: u16) -> Claim {
    let path = format!("{CLAIMS_DIR}/{port}");
    if std::fs::create_dir_all(CLAIMS_DIR).is_ok() {
        // Every user's test processes claim here (a lock needs only a file opened for reading).
        let _ = std::fs::set_permissions(CLAIMS_DIR, std::fs::Permissions::from_mode(0o1777));
    }
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .or_else(|_| File::open(&path));
    let Ok(file) = opened else {
        return Claim::Unavailable;
    };
    match file.try_lock() {
        Ok(()) => Claim::Held(file),
        Err(TryLockError::WouldBlock) => Claim::TakenElsewhere,
        Err(TryLockError::Error(_)) => Claim::Unavailable,
    }
}

/// What this process handed out: the ports, where its walk stands, and its claims.
struct Handed {
    ports: HashSet<u16>,
    cursor: u32,
    claims: Vec<File>,
}

/// A free port on 127.0.0.1, outside the kernel's ephemeral range where it can be, never the
/// same twice in this process. Another process may still bind it before our child does.
pub fn free_port() -> Result<u16> {
    static STATE: Mutex<Option<Handed>> = Mutex::new(None);
    let mut guard = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    let Handed {
        ports: handed_out,
        cursor,
        claims,
    } = guard.get_or_insert_with(|| Handed {
        ports: HashSet::new(),
        cursor: std::process::id(),
        claims: Vec::new(),
    });
    if let Some(range) = below_ephemeral(ephemeral_range().as_ref()) {
        let span = u32::from(range.end - range.start);
        // Processes running side by side start at different places (their pids), and each walks
        // on from where it stopped; the claims keep them apart where their walks meet.
        for _ in 0..span {
            *cursor = cursor.wrapping_add(1);
            let port = range.start + u16::try_from(*cursor % span).unwrap_or(0);
            if handed_out.contains(&port) {
                continue;
            }
            let held = match claim(port) {
                Claim::TakenElsewhere => continue,
                Claim::Held(file) => Some(file),
                Claim::Unavailable => None,
            };
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed_out.insert(port);
                claims.extend(held);
                return Ok(port);
            }
        }
    }
    loop {
        let port = TcpListener::bind(("127.0.0.1", 0))
            .context("binding a free port")?
            .local_addr()?
            .port();
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
}

/// The kernel's ephemeral port range (`ip_local_port_range`), if it can be read.
fn ephemeral_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    parse_range(&text)
}

fn parse_range(text: &str) -> Option<(u16, u16)> {
    let mut parts = text.split_whitespace().map(str::parse::<u16>);
    let low = parts.next()?.ok()?;
    let high = parts.next()?.ok()?;
    (low <= high).then_some((low, high))
}

/// The ports to use: from [`LOWEST`] up to the ephemeral range, if that leaves enough of them.
fn below_ephemeral(ephemeral: Option<&(u16, u16)>) -> Option<Range<u16>> {
    let (low, _) = ephemeral?;
    (*low >= LOWEST.saturating_add(MIN_SPAN)).then_some(LOWEST..*low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_below_the_ephemeral_range() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_range("60999 32768"), None);
        assert_eq!(parse_range("x"), None);
        assert_eq!(below_ephemeral(Some(&(32768, 60999))), Some(20_000..32768));
        // Too little room below it (or no range known): the kernel's choice is used.
        assert_eq!(below_ephemeral(Some(&(20_500, 60999))), None);
        assert_eq!(below_ephemeral(None), None);
    }

    #[test]
    fn a_port_is_not_handed_out_twice_and_is_free() {
        // Each bound as soon as it is handed out, and held: the test binaries of `make test` run
        // side by side, and another's fleet may bind a port this one released a while ago
        // (binding all 50 only at the end failed once, "address already in use").
        let mut held = Vec::new();
        let ports: Vec<u16> = (0..50)
            .map(|_| {
                let port = free_port().unwrap();
                held.push(TcpListener::bind(("127.0.0.1", port)).unwrap());
                port
            })
            .collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        if let Some(range) = below_ephemeral(ephemeral_range().as_ref()) {
            assert!(
                ports.iter().all(|p| range.contains(p)),
                "{ports:?} outside {range:?}"
            );
        }
        assert_eq!(held.len(), ports.len());
    }

    #[test]
    fn a_port_another_process_claimed_is_not_claimed_again() {
        // A lock taken through another open file stands for another process: flock locks
        // belong to the open file, so they conflict within one process too.
        let port = free_port().unwrap();
        if below_ephemeral(ephemeral_range().as_ref()).is_none() {
            return; // the kernel's choice was used: nothing is claimed
        }
        assert!(
            matches!(claim(port), Claim::TakenElsewhere),
            "port {port} claimed twice"
        );
        let other = LOWEST - 1;
        match claim(other) {
            Claim::Held(file) => {
                assert!(matches!(claim(other), Claim::TakenElsewhere));
                drop(file);
                assert!(
                    matches!(claim(other), Claim::Held(_)),
                    "a released claim is free again"
                );
            }
            Claim::TakenElsewhere => panic!("port {other} is never handed out, yet claimed"),
            Claim::Unavailable => panic!("{CLAIMS_DIR} cannot be used"),
        }
    }
}
