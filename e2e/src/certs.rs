//! Certificates generated in-process with rcgen (ECDSA P-256, long validity; test use only).
//!
//! - [`ClusterCerts`]: everything one control plane needs: a CA that signs both the apiserver's
//!   serving certificate and its client certificates, the serving certificate for `127.0.0.1` and
//!   `localhost`, an admin client certificate in `system:masters`, and the service-account signing
//!   key pair.
//! - [`WebhookCerts`]: a CA and a serving certificate for an HTTPS server on loopback (the
//!   machine-webhook in tests), with the CA PEM ready for a webhook's `caBundle`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate with its private key, both PEM.
#[derive(Clone, Debug)]
pub struct CertPem {
    pub cert: String,
    pub key: String,
}

/// A CA that can sign further certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA with the given common name.
    pub fn generate(common_name: &str) -> Result<Ca> {
        let key = KeyPair::generate().context("generating CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).context("self-signing CA")?;
        Ok(Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn serving_cert(&self, common_name: &str, sans: &[&str]) -> Result<CertPem> {
        let mut params = CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        self.sign(&params)
    }

    /// A client certificate for Kubernetes user `user` in the given groups (organisations).
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<CertPem> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params.distinguished_name.push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        self.sign(&params)
    }

    fn sign(&self, params: &CertificateParams) -> Result<CertPem> {
        let key = KeyPair::generate().context("generating key")?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("signing certificate")?;
        Ok(CertPem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// The Kubernetes user name of the admin client certificate.
pub const ADMIN_USER: &str = "kkp-quota-admin";
/// The group that RBAC lets do anything.
pub const MASTERS_GROUP: &str = "system:masters";

/// The credentials of one control plane.
#[derive(Debug)]
pub struct ClusterCerts {
    /// Signs the serving certificate and every client certificate (`--client-ca-file`).
    pub ca: Ca,
    /// kube-apiserver's serving certificate, for `127.0.0.1` and `localhost`.
    pub serving: CertPem,
    /// Client certificate of [`ADMIN_USER`] in [`MASTERS_GROUP`].
    pub admin: CertPem,
    /// Service-account token signing key (private PEM) ...
    pub service_account_key: String,
    /// ... and its public half.
    pub service_account_pub: String,
}

impl ClusterCerts {
    pub fn generate(cluster: &str) -> Result<ClusterCerts> {
        ClusterCerts::generate_with(cluster, &[])
    }

    /// [`ClusterCerts::generate`], the serving certificate also valid for `extra_sans`.
    pub fn generate_with(cluster: &str, extra_sans: &[String]) -> Result<ClusterCerts> {
        let ca = Ca::generate(&format!("kkp-quota {cluster} CA"))?;
        let mut sans = vec!["127.0.0.1", "localhost"];
        sans.extend(extra_sans.iter().map(String::as_str));
        let serving = ca.serving_cert("kube-apiserver", &sans)?;
        let admin = ca.client_cert(ADMIN_USER, &[MASTERS_GROUP])?;
        let sa = KeyPair::generate().context("generating service-account key")?;
        Ok(ClusterCerts {
            ca,
            serving,
            admin,
            service_account_key: sa.serialize_pem(),
            service_account_pub: sa.public_key_pem(),
        })
    }
}

/// A CA and a serving certificate for `127.0.0.1` and `localhost`, for an HTTPS server that a
/// kube-apiserver calls (the machine-webhook). Put [`WebhookCerts::ca_pem`] in the webhook
/// configuration's `caBundle` (base64 of the PEM).
#[derive(Clone, Debug)]
pub struct WebhookCerts {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Where [`WebhookCerts::write_to`] put the files.
#[derive(Clone, Debug)]
pub struct WebhookCertPaths {
    /// `ca.crt`
    pub ca: PathBuf,
    /// `tls.crt`
    pub cert: PathBuf,
    /// `tls.key`
    pub key: PathBuf,
}

impl WebhookCerts {
    pub fn generate() -> Result<WebhookCerts> {
        let ca = Ca::generate("kkp-quota webhook CA")?;
        let serving = ca.serving_cert("kkp-quota-webhook", &["127.0.0.1", "localhost"])?;
        Ok(WebhookCerts {
            ca_pem: ca.cert_pem().to_owned(),
            cert_pem: serving.cert,
            key_pem: serving.key,
        })
    }

    /// Writes `ca.crt`, `tls.crt` and `tls.key` into `dir` (created if missing).
    pub fn write_to(&self, dir: &Path) -> Result<WebhookCertPaths> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let paths = WebhookCertPaths {
            ca: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        for (path, text) in [
            (&paths.ca, &self.ca_pem),
            (&paths.cert, &self.cert_pem),
            (&paths.key, &self.key_pem),
        ] {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(paths)
    }

    /// The CA as a webhook `caBundle` value (the PEM bytes; serialisation base64-encodes them).
    pub fn ca_bundle(&self) -> k8s_openapi::ByteString {
        k8s_openapi::ByteString(self.ca_pem.clone().into_bytes())
    }
}
