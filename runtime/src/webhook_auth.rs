//! Who may call the admission endpoint: only a user cluster's own API server.
//!
//! seed-controller writes into each user cluster's `ValidatingWebhookConfiguration` the URL
//! `<base>/validate/machines/<cluster>/<token>`, where
//!
//! ```text
//! token = base64url(HMAC-SHA256(key, "<cluster name>/<cluster UID>"))   (no padding, 43 chars)
//! ```
//!
//! `key` is a secret shared by seed-controller and machine-webhook on the seed (a file of
//! base64 keys, one per line: the FIRST signs, ALL verify, so a key rotates without downtime).
//! The webhook recomputes the token from the `Cluster` object in its cache (its UID, so a
//! Cluster deleted and created again under the same name gets a new token) and compares in
//! constant time. A user-cluster admin can read their own webhook configuration and so their
//! own token, which only ever authorises calls about their own cluster's project.
//!
//! The key file is re-read when it changes on disk (modification time and size), like the
//! serving certificate; a file that does not load keeps the previous keys.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use ring::hmac;
use tracing::{info, warn};

/// The admission path's prefix; the full path is `<prefix>/<cluster>/<token>`.
pub const PATH_PREFIX: &str = "/validate/machines";

/// Where the seed's API server sends `Cluster` creates: `<prefix>/<seed>/<token>`.
pub const CLUSTERS_PATH_PREFIX: &str = "/validate/clusters";

/// What the token of the seed's `Cluster` path is signed over in place of a user cluster's UID
/// (a UID is a UUID, never this).
pub const SEED_CLUSTERS_UID: &str = "seed-clusters";

/// Shortest key accepted, in bytes (the HMAC-SHA256 output size).
pub const MIN_KEY_BYTES: usize = 32;

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: line {line}: {what}")]
    Invalid {
        path: PathBuf,
        line: usize,
        what: String,
    },
    #[error("{path}: no key in the file (one base64 key per line; the first signs)")]
    Empty { path: PathBuf },
}

/// The URL-signing keys: the first signs, every one verifies.
#[derive(Clone)]
pub struct SigningKeys {
    keys: Vec<hmac::Key>,
    /// A short, non-secret identity of each key (for logs and for noticing a new first key).
    fingerprints: Vec<String>,
}

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeys")
            .field("fingerprints", &self.fingerprints)
            .finish_non_exhaustive()
    }
}

fn fingerprint(raw: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, raw);
    digest.as_ref()[..6].iter().fold(String::new(), |mut text, b| {
        use std::fmt::Write as _;
        let _ = write!(text, "{b:02x}");
        text
    })
}

fn message(cluster: &str, uid: &str) -> Vec<u8> {
    format!("{cluster}/{uid}").into_bytes()
}

impl SigningKeys {
    /// Parses a key file: one base64 (standard or URL-safe) key of at least 32 bytes per line;
    /// blank lines and lines starting with `#` are ignored. Errors name the line (1-based),
    /// never the key.
    pub fn parse(text: &str) -> Result<SigningKeys, (usize, String)> {
        let mut keys = Vec::new();
        let mut fingerprints = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let raw = STANDARD
                .decode(line)
                .or_else(|_| URL_SAFE.decode(line))
                .or_else(|_| URL_SAFE_NO_PAD.decode(line))
                .map_err(|_| (index + 1, "not base64".to_owned()))?;
            if raw.len() < MIN_KEY_BYTES {
                return Err((
                    index + 1,
                    format!(
                        "key is {} bytes, at least {MIN_KEY_BYTES} are needed (e.g. `head -c 32 /dev/urandom | base64`)",
                        raw.len()
                    ),
                ));
            }
            fingerprints.push(fingerprint(&raw));
            keys.push(hmac::Key::new(hmac::HMAC_SHA256, &raw));
        }
        if keys.is_empty() {
            return Err((0, "no key".to_owned()));
        }
        Ok(SigningKeys { keys, fingerprints })
    }

    /// Reads and parses a key file.
    pub fn load(path: &Path) -> Result<SigningKeys, KeyError> {
        let text = fs::read_to_string(path).map_err(|source| KeyError::Read {
            path: path.to_owned(),
            source,
        })?;
        SigningKeys::parse(&text).map_err(|(line, what)| {
            if line == 0 {
                KeyError::Empty {
                    path: path.to_owned(),
                }
            } else {
                KeyError::Invalid {
                    path: path.to_owned(),
                    line,
                    what,
                }
            }
        })
    }

    /// The token for a user cluster, signed with the first key.
    pub fn sign(&self, cluster: &str, uid: &str) -> String {
        // `parse` never returns an empty set.
        let tag = hmac::sign(&self.keys[0], &message(cluster, uid));
        URL_SAFE_NO_PAD.encode(tag.as_ref())
    }

    /// Which key (index in the file) `token` was signed with for this cluster, if any. Every
    /// key is tried (constant-time comparison each), so the time taken does not depend on
    /// which one matches or how much of the token is right.
    pub fn verify(&self, cluster: &str, uid: &str, token: &str) -> Option<usize> {
        // Cluster names are DNS labels; one with '/' (a percent-encoded path segment) would make
        // "<cluster>/<uid>" ambiguous.
        if cluster.contains('/') {
            return None;
        }
        let tag = URL_SAFE_NO_PAD.decode(token.as_bytes()).ok()?;
        let message = message(cluster, uid);
        let mut matched = None;
        for (index, key) in self.keys.iter().enumerate() {
            if hmac::verify(key, &message, &tag).is_ok() && matched.is_none() {
                matched = Some(index);
            }
        }
        matched
    }

    /// The first (signing) key's fingerprint: changes when the signing key does.
    pub fn signing_fingerprint(&self) -> &str {
        &self.fingerprints[0]
    }

    pub fn fingerprints(&self) -> &[String] {
        &self.fingerprints
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A fresh random key (32 bytes, standard base64), one line of a key file.
pub fn generate_key() -> String {
    use ring::rand::SecureRandom as _;
    let mut raw = [0u8; MIN_KEY_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut raw)
        .unwrap_or_else(|_| panic!("the operating system's random number generator failed"));
    STANDARD.encode(raw)
}

/// The URL seed-controller writes for a user cluster.
pub fn webhook_url(base: &str, cluster: &str, token: &str) -> String {
    format!("{}{PATH_PREFIX}/{cluster}/{token}", base.trim_end_matches('/'))
}

type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

#[derive(Debug)]
struct Loaded {
    stamp: Stamp,
    keys: Arc<SigningKeys>,
}

/// The keys in a file, re-read when it changes on disk.
#[derive(Debug)]
pub struct ReloadingKeys {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

impl ReloadingKeys {
    /// Loads the file once; fails when it cannot (no keys: nothing could be verified).
    pub fn new(path: &Path) -> Result<ReloadingKeys, KeyError> {
        let stamp = stamp(path);
        let keys = SigningKeys::load(path)?;
        info!(path = %path.display(), keys = ?keys.fingerprints(), "URL-signing keys loaded");
        Ok(ReloadingKeys {
            path: path.to_owned(),
            loaded: Mutex::new(Loaded {
                stamp,
                keys: Arc::new(keys),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current keys (the file is checked for a change on every call: one `stat`).
    pub fn current(&self) -> Arc<SigningKeys> {
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let stamp = stamp(&self.path);
        if stamp != loaded.stamp {
            loaded.stamp = stamp;
            match SigningKeys::load(&self.path) {
                Ok(keys) => {
                    info!(path = %self.path.display(), keys = ?keys.fingerprints(), "URL-signing keys reloaded");
                    loaded.keys = Arc::new(keys);
                }
                Err(e) => {
                    warn!(error = %e, "URL-signing keys changed but do not load; keeping the previous ones");
                }
            }
        }
        Arc::clone(&loaded.keys)
    }
}

/// Why a call was refused before any decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthFailure {
    /// The path has no token (`/validate/machines/<cluster>`): 401.
    MissingToken,
    /// No `Cluster` of that name on the seed (never existed, or deleted): 403.
    UnknownCluster,
    /// The token is not valid for this cluster under any key (forged, another cluster's, or
    /// signed with a key that was dropped): 403.
    InvalidToken,
    /// The webhook has not listed the `Cluster`s yet, so it cannot verify anything: 503.
    NotReady,
}

impl AuthFailure {
    pub const ALL: [AuthFailure; 4] = [
        AuthFailure::MissingToken,
        AuthFailure::UnknownCluster,
        AuthFailure::InvalidToken,
        AuthFailure::NotReady,
    ];

    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            AuthFailure::MissingToken => "missing_token",
            AuthFailure::UnknownCluster => "unknown_cluster",
            AuthFailure::InvalidToken => "invalid_token",
            AuthFailure::NotReady => "not_ready",
        }
    }

    pub const fn status(self) -> u16 {
        match self {
            AuthFailure::MissingToken => 401,
            AuthFailure::UnknownCluster | AuthFailure::InvalidToken => 403,
            AuthFailure::NotReady => 503,
        }
    }

    /// The response body: the same for an unknown cluster and a wrong token, so a caller
    /// cannot learn which cluster names exist.
    pub const fn body(self) -> &'static str {
        match self {
            AuthFailure::MissingToken => {
                "401 Unauthorized: no credentials; the webhook URL must be /validate/machines/<cluster>/<token> as written by seed-controller\n"
            }
            AuthFailure::UnknownCluster | AuthFailure::InvalidToken => {
                "403 Forbidden: these credentials are not valid for this user cluster\n"
            }
            AuthFailure::NotReady => "503 Service Unavailable: the webhook is starting; try again\n",
        }
    }
}

/// Logs refused calls at a limited rate: at most one line per reason per `every`, with the
/// number of refusals not logged since the previous line.
#[derive(Debug)]
pub struct RateLimitedLog {
    every: std::time::Duration,
    state: Mutex<std::collections::HashMap<AuthFailure, (std::time::Instant, u64)>>,
}

impl RateLimitedLog {
    pub fn new(every: std::time::Duration) -> RateLimitedLog {
        RateLimitedLog {
            every,
            state: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Whether to log this refusal now, and how many were suppressed before it.
    pub fn admit(&self, reason: AuthFailure, now: std::time::Instant) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match state.get_mut(&reason) {
            Some((last, suppressed)) if now.duration_since(*last) < self.every => {
                *suppressed += 1;
                None
            }
            Some(entry) => {
                let suppressed = entry.1;
                *entry = (now, 0);
                Some(suppressed)
            }
            None => {
                state.insert(reason, (now, 0));
                Some(0)
            }
        }
    }

    /// Logs a refused call (if the rate allows).
    pub fn refused(&self, reason: AuthFailure, cluster: &str, peer: Option<std::net::SocketAddr>) {
        if let Some(suppressed) = self.admit(reason, std::time::Instant::now()) {
            let peer = peer.map(|p| p.to_string()).unwrap_or_default();
            warn!(
                reason = reason.as_str(),
                cluster,
                peer,
                suppressed_since_last_line = suppressed,
                "refused an admission call without valid credentials"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> String {
        STANDARD.encode([byte; 32])
    }

    #[test]
    fn a_token_verifies_for_its_cluster_and_uid_only() {
        let keys = SigningKeys::parse(&key(1)).expect("keys");
        let token = keys.sign("alpha", "uid-a");
        assert_eq!(token.len(), 43);
        assert_eq!(keys.verify("alpha", "uid-a", &token), Some(0));
        assert_eq!(keys.verify("beta", "uid-a", &token), None);
        assert_eq!(
            keys.verify("alpha", "uid-b", &token),
            None,
            "Cluster recreated: new UID"
        );
        assert_eq!(keys.verify("alpha", "uid-a", ""), None);
        assert_eq!(keys.verify("alpha", "uid-a", "not base64!"), None);
        assert_eq!(keys.verify("alpha", "uid-a", &token[..42]), None);
        // "a/b" + "c" would sign the same text as "a" + "b/c": a name with '/' never verifies.
        assert_eq!(keys.verify("a/b", "c", &keys.sign("a", "b/c")), None);
    }

    #[test]
    fn the_first_key_signs_and_every_key_verifies() {
        let old = SigningKeys::parse(&key(1)).expect("old");
        let both = SigningKeys::parse(&format!("# rotation\n{}\n\n{}\n", key(2), key(1))).expect("both");
        let new = SigningKeys::parse(&key(2)).expect("new");
        let old_token = old.sign("alpha", "u");
        assert_eq!(both.verify("alpha", "u", &old_token), Some(1));
        assert_eq!(both.verify("alpha", "u", &both.sign("alpha", "u")), Some(0));
        assert_eq!(new.verify("alpha", "u", &old_token), None);
        assert_eq!(both.signing_fingerprint(), new.signing_fingerprint());
        assert_ne!(old.signing_fingerprint(), new.signing_fingerprint());
    }

    #[test]
    fn bad_key_files_name_the_line_not_the_key() {
        assert_eq!(SigningKeys::parse("").map(|_| ()), Err((0, "no key".into())));
        assert_eq!(
            SigningKeys::parse("# only a comment\n")
                .map(|_| ())
                .err()
                .map(|e| e.0),
            Some(0)
        );
        let short = SigningKeys::parse(&format!("{}\n{}", key(1), STANDARD.encode([1u8; 16])));
        assert_eq!(short.err().map(|e| e.0), Some(2));
        assert_eq!(SigningKeys::parse("%%%").err().map(|e| e.0), Some(1));
        // URL-safe base64 is accepted too.
        assert!(SigningKeys::parse(&URL_SAFE_NO_PAD.encode([0xfb; 32])).is_ok());
    }

    #[test]
    fn generated_keys_load_and_differ() {
        let (a, b) = (generate_key(), generate_key());
        assert_ne!(a, b);
        assert!(SigningKeys::parse(&a).is_ok());
    }

    #[test]
    fn refusals_are_logged_once_per_reason_per_window() {
        let log = RateLimitedLog::new(std::time::Duration::from_secs(10));
        let t0 = std::time::Instant::now();
        assert_eq!(log.admit(AuthFailure::InvalidToken, t0), Some(0));
        assert_eq!(log.admit(AuthFailure::InvalidToken, t0), None);
        assert_eq!(
            log.admit(AuthFailure::InvalidToken, t0 + std::time::Duration::from_secs(9)),
            None
        );
        assert_eq!(
            log.admit(AuthFailure::MissingToken, t0),
            Some(0),
            "reasons are apart"
        );
        assert_eq!(
            log.admit(AuthFailure::InvalidToken, t0 + std::time::Duration::from_secs(10)),
            Some(2),
            "the next line says how many were not logged"
        );
    }

    #[test]
    fn the_url_has_the_cluster_and_token() {
        assert_eq!(
            webhook_url("https://h:9443/", "alpha", "T"),
            "https://h:9443/validate/machines/alpha/T"
        );
    }

    #[test]
    fn reloads_when_the_file_changes_and_keeps_the_old_keys_when_it_breaks() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keys");
        fs::write(&path, key(1)).expect("write");
        let keys = ReloadingKeys::new(&path).expect("load");
        let first = keys.current().signing_fingerprint().to_owned();
        fs::write(&path, format!("{}\n{}\n", key(2), key(1))).expect("write");
        let second = keys.current();
        assert_ne!(second.signing_fingerprint(), first);
        assert_eq!(second.len(), 2);
        fs::write(&path, "garbage that is longer than before").expect("write");
        assert_eq!(keys.current().signing_fingerprint(), second.signing_fingerprint());
    }
}
