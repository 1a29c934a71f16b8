//! The serving certificate, read from files and re-read when they change on disk (cert-manager
//! and KKP both rotate them in place).
//!
//! On every TLS handshake the resolver compares the files' modification times and sizes with the
//! ones it loaded; when they differ it loads the pair again. A pair that does not load (half
//! written, mismatched) is ignored and the previous one kept until the next change.

use std::fs;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// The certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error("TLS set-up: {0}")]
    Rustls(#[from] rustls::Error),
}

type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Loads a PEM certificate chain and private key.
pub fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let read = |path: &Path| {
        fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let cert_pem = read(cert)?;
    let key_pem = read(key)?;
    let chain = rustls_pemfile::certs(&mut BufReader::new(cert_pem.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            path: cert.to_owned(),
            what: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Invalid {
            path: cert.to_owned(),
            what: "no certificate in the file".into(),
        });
    }
    let private = rustls_pemfile::private_key(&mut BufReader::new(key_pem.as_slice()))
        .map_err(|e| TlsError::Invalid {
            path: key.to_owned(),
            what: e.to_string(),
        })?
        .ok_or_else(|| TlsError::Invalid {
            path: key.to_owned(),
            what: "no private key in the file".into(),
        })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&private)?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match()?;
    Ok(certified)
}

#[derive(Debug)]
struct Loaded {
    stamps: (Stamp, Stamp),
    key: Arc<CertifiedKey>,
}

/// Serves the certificate in `cert`/`key`, reloading it when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
}

impl ReloadingCert {
    /// Loads the pair once; fails when it cannot (a webhook without a certificate is useless).
    pub fn new(cert: &Path, key: &Path) -> Result<ReloadingCert, TlsError> {
        let stamps = (stamp(cert), stamp(key));
        let certified = load_pair(cert, key)?;
        Ok(ReloadingCert {
            cert: cert.to_owned(),
            key: key.to_owned(),
            loaded: Mutex::new(Loaded {
                stamps,
                key: Arc::new(certified),
            }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let stamps = (stamp(&self.cert), stamp(&self.key));
        if stamps != loaded.stamps {
            loaded.stamps = stamps;
            match load_pair(&self.cert, &self.key) {
                Ok(certified) => {
                    info!(cert = %self.cert.display(), "serving certificate reloaded");
                    loaded.key = Arc::new(certified);
                }
                Err(e) => {
                    warn!(error = %e, "serving certificate changed but does not load; keeping the previous one");
                }
            }
        }
        Arc::clone(&loaded.key)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A rustls server configuration (HTTP/1.1 and HTTP/2) serving `cert`.
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
