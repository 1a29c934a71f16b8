//! The webhook's serving certificate, when the system manages it itself
//! (`--webhook-certificate-secret`): seed-controller (the leader) keeps a CA and a serving
//! certificate in one Secret that the webhook pods and seed-controller mount, and rotates them
//! without a moment in which a user cluster's API server distrusts the webhook.
//!
//! Rotation is two steps, because mounted Secrets reach pods late (the kubelet syncs them about
//! once a minute) and the CA bundle reaches user clusters through seed-controller:
//! 1. **stage**: a new CA and certificate are made; the new CA joins `ca.crt` (so it is trusted
//!    everywhere), the new certificate waits in `next.crt`/`next.key`;
//! 2. **promote**, `--webhook-certificate-overlap` later: the new certificate becomes
//!    `tls.crt`/`tls.key`, which the webhook serves once its files change.
//!
//! A CA is dropped from the bundle once it has expired. Each CA signs one certificate and its
//! key is never stored. [`plan`] decides; [`run`] reads and writes the Secret.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kkp_quota_runtime::chain::Chain;
use kube::Api;
use kube::api::PostParams;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::Shared;

/// The annotation that records what the Secret holds (validity and names), so no certificate
/// has to be parsed to decide.
pub const STATE_ANNOTATION: &str = "kkp-quota.dev/webhook-certificate";
pub const CA_KEY: &str = "ca.crt";
pub const CERT_KEY: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";
pub const NEXT_CERT_KEY: &str = "next.crt";
pub const NEXT_KEY_KEY: &str = "next.key";

/// What the certificates should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub dns_names: Vec<String>,
    /// Lifetime of each CA and certificate, in seconds.
    pub validity: i64,
    /// How long a staged certificate waits (its CA already trusted) before it is served.
    pub overlap: i64,
}

/// The Secret's data.
type Data = BTreeMap<String, ByteString>;

/// One certificate as recorded in [`STATE_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Issued {
    /// Unix seconds.
    pub not_after: i64,
    pub dns_names: Vec<String>,
    /// When it was made (Unix seconds).
    pub issued_at: i64,
}

/// What the Secret holds, per [`STATE_ANNOTATION`]. `cas[i]` expires at `ca_not_after[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    #[serde(default)]
    pub ca_not_after: Vec<i64>,
    #[serde(default)]
    pub serving: Option<Issued>,
    #[serde(default)]
    pub next: Option<Issued>,
}

/// What to do to the Secret now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Keep,
    /// No usable certificate (none yet, expired, or for other names): make one and serve it
    /// at once; nothing else is trusted that could be kept.
    Issue,
    /// The certificate has used two thirds of its life: make the next one, trust its CA.
    Stage,
    /// The staged certificate's CA has been trusted for the overlap: serve it.
    Promote,
    /// A CA in the bundle has expired: drop it.
    Prune,
}

/// The step for a Secret in `state` at `now` (Unix seconds).
pub fn plan(state: &State, now: i64, settings: &Settings) -> Step {
    let usable = |c: &Issued| now < c.not_after && c.dns_names == settings.dns_names;
    let Some(serving) = state.serving.as_ref().filter(|s| usable(s)) else {
        return Step::Issue;
    };
    if let Some(next) = &state.next {
        if !usable(next) {
            return Step::Issue;
        }
        if now - next.issued_at >= settings.overlap {
            return Step::Promote;
        }
    } else if stage_due(serving, now, settings) {
        return Step::Stage;
    }
    if state.ca_not_after.iter().any(|&t| t <= now) {
        return Step::Prune;
    }
    Step::Keep
}

/// Whether the served certificate is old enough for the next one: two thirds of its life are
/// gone, or what is left is under two overlaps (so the next one is served before it expires).
fn stage_due(serving: &Issued, now: i64, settings: &Settings) -> bool {
    let left = serving.not_after - now;
    left * 3 < settings.validity || left < 2 * settings.overlap
}

/// A CA and the one certificate it signs, PEM.
struct Pair {
    ca: String,
    cert: String,
    key: String,
    issued: Issued,
}

fn generate(settings: &Settings, now: i64) -> Result<Pair, rcgen::Error> {
    let not_before = time::OffsetDateTime::from_unix_timestamp(now - 300).map_err(|_| rcgen::Error::Time)?;
    let not_after_unix = now + settings.validity;
    let not_after =
        time::OffsetDateTime::from_unix_timestamp(not_after_unix).map_err(|_| rcgen::Error::Time)?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, format!("kkp-quota webhook CA {now}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    (ca.not_before, ca.not_after) = (not_before, not_after);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(settings.dns_names.clone())?;
    if let Some(first) = settings.dns_names.first() {
        serving.distinguished_name.push(DnType::CommonName, first.clone());
    }
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.use_authority_key_identifier_extension = true;
    (serving.not_before, serving.not_after) = (not_before, not_after);
    let cert = serving.signed_by(&key, &issuer)?;
    Ok(Pair {
        ca: ca_cert.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
        issued: Issued {
            not_after: not_after_unix,
            dns_names: settings.dns_names.clone(),
            issued_at: now,
        },
    })
}

/// The PEM blocks of a bundle, in order.
fn pem_blocks(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .map(str::trim)
        .filter(|b| b.ends_with(END))
        .map(|b| format!("{b}\n"))
        .collect()
}

/// The Secret's data and state after `step`; `None` for [`Step::Keep`].
fn apply(
    step: Step,
    state: &State,
    data: &Data,
    settings: &Settings,
    now: i64,
) -> Result<Option<(State, Data)>, rcgen::Error> {
    let text = |k: &str| data.get(k).map(|b| String::from_utf8_lossy(&b.0).into_owned());
    let mut cas: Vec<(String, i64)> = pem_blocks(&text(CA_KEY).unwrap_or_default())
        .into_iter()
        .zip(state.ca_not_after.iter().copied())
        .collect();
    let mut out = data.clone();
    let mut next_state = state.clone();
    match step {
        Step::Keep => return Ok(None),
        Step::Issue => {
            let pair = generate(settings, now)?;
            cas.retain(|(_, t)| *t > now);
            cas.insert(0, (pair.ca, pair.issued.not_after));
            out.insert(CERT_KEY.into(), ByteString(pair.cert.into_bytes()));
            out.insert(KEY_KEY.into(), ByteString(pair.key.into_bytes()));
            out.remove(NEXT_CERT_KEY);
            out.remove(NEXT_KEY_KEY);
            next_state.serving = Some(pair.issued);
            next_state.next = None;
        }
        Step::Stage => {
            let pair = generate(settings, now)?;
            cas.insert(0, (pair.ca, pair.issued.not_after));
            out.insert(NEXT_CERT_KEY.into(), ByteString(pair.cert.into_bytes()));
            out.insert(NEXT_KEY_KEY.into(), ByteString(pair.key.into_bytes()));
            next_state.next = Some(pair.issued);
        }
        Step::Promote => {
            for (from, to) in [(NEXT_CERT_KEY, CERT_KEY), (NEXT_KEY_KEY, KEY_KEY)] {
                if let Some(v) = out.remove(from) {
                    out.insert(to.into(), v);
                }
            }
            next_state.serving = next_state.next.take();
        }
        Step::Prune => cas.retain(|(_, t)| *t > now),
    }
    out.insert(
        CA_KEY.into(),
        ByteString(
            cas.iter()
                .map(|(pem, _)| pem.as_str())
                .collect::<String>()
                .into_bytes(),
        ),
    );
    next_state.ca_not_after = cas.iter().map(|(_, t)| *t).collect();
    Ok(Some((next_state, out)))
}

/// How often the Secret is looked at.
fn period(settings: &Settings) -> Duration {
    let overlap = u64::try_from(settings.overlap / 4).unwrap_or(1).max(1);
    Duration::from_secs(overlap.min(30))
}

/// Keeps the Secret `name` in `namespace` (it must exist; the chart creates it empty) for as
/// long as the future runs.
pub async fn run(shared: Arc<Shared>, namespace: String, name: String, settings: Settings) {
    let api: Api<Secret> = Api::namespaced(shared.seed.clone(), &namespace);
    let mut ticker = tokio::time::interval(period(&settings));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(e) = once(&api, &name, &settings).await {
            warn!(secret = %name, %namespace, error = %Chain(&e), "could not keep the webhook certificate; retrying");
        }
    }
}

/// Why one look at the certificate Secret did not end with it current.
#[derive(Debug, thiserror::Error)]
enum KeepError {
    #[error("reading the Secret")]
    Read(#[source] kube::Error),
    #[error("issuing a certificate")]
    Issue(#[source] rcgen::Error),
    #[error("encoding the rotation state")]
    Encode(#[source] serde_json::Error),
    #[error("writing the Secret")]
    Write(#[source] kube::Error),
}

async fn once(api: &Api<Secret>, name: &str, settings: &Settings) -> Result<(), KeepError> {
    let mut secret = api.get(name).await.map_err(KeepError::Read)?;
    let state: State = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATE_ANNOTATION))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    let now = jiff::Timestamp::now().as_second();
    let step = plan(&state, now, settings);
    let data = secret.data.clone().unwrap_or_default();
    let Some((state, data)) = apply(step, &state, &data, settings, now).map_err(KeepError::Issue)? else {
        return Ok(());
    };
    secret
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            STATE_ANNOTATION.into(),
            serde_json::to_string(&state).map_err(KeepError::Encode)?,
        );
    secret.data = Some(data);
    // A replace carries the resourceVersion read above: a concurrent writer makes it fail, and
    // the next tick decides again from what is there.
    api.replace(name, &PostParams::default(), &secret)
        .await
        .map_err(KeepError::Write)?;
    info!(secret = %name, ?step, cas = state.ca_not_after.len(), "webhook certificate Secret updated");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::pem::PemObject as _;

    const DAY: i64 = 86_400;

    fn settings() -> Settings {
        Settings {
            dns_names: vec!["kkp-quota-machine-webhook.kubermatic.svc".into()],
            validity: 90 * DAY,
            overlap: 600,
        }
    }

    /// Runs the plan from `state` at `now` until it keeps, returning the steps taken.
    fn settle(
        state: &mut State,
        data: &mut BTreeMap<String, ByteString>,
        now: i64,
        s: &Settings,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        loop {
            let step = plan(state, now, s);
            match apply(step, state, data, s, now).unwrap() {
                None => return steps,
                Some((st, d)) => {
                    (*state, *data) = (st, d);
                    steps.push(step);
                }
            }
            assert!(steps.len() < 5, "no fixed point: {steps:?}");
        }
    }

    #[test]
    fn a_lifetime_issues_stages_promotes_and_prunes_in_order() {
        let s = settings();
        let (mut state, mut data) = (State::default(), BTreeMap::new());
        let t0 = 1_000_000_000;
        assert_eq!(settle(&mut state, &mut data, t0, &s), [Step::Issue]);
        assert_eq!(state.ca_not_after.len(), 1);
        let first_cert = data[CERT_KEY].clone();
        // Two thirds in: staged, its CA trusted, the old certificate still served.
        let t1 = t0 + 61 * DAY;
        assert_eq!(settle(&mut state, &mut data, t1, &s), [Step::Stage]);
        assert_eq!(state.ca_not_after.len(), 2);
        assert_eq!(pem_blocks(&String::from_utf8_lossy(&data[CA_KEY].0)).len(), 2);
        assert_eq!(data[CERT_KEY], first_cert);
        assert!(data.contains_key(NEXT_CERT_KEY));
        // Not before the overlap has passed ...
        assert_eq!(settle(&mut state, &mut data, t1 + 599, &s), []);
        // ... then served; both CAs stay until the old one expires.
        assert_eq!(settle(&mut state, &mut data, t1 + 600, &s), [Step::Promote]);
        assert_ne!(data[CERT_KEY], first_cert);
        assert!(!data.contains_key(NEXT_CERT_KEY));
        assert_eq!(state.ca_not_after.len(), 2);
        assert_eq!(settle(&mut state, &mut data, t0 + 90 * DAY, &s), [Step::Prune]);
        assert_eq!(state.ca_not_after.len(), 1);
        assert_eq!(pem_blocks(&String::from_utf8_lossy(&data[CA_KEY].0)).len(), 1);
    }

    #[test]
    fn a_long_overlap_stages_early_enough_to_be_served_before_expiry() {
        let s = Settings {
            overlap: 30 * DAY,
            ..settings()
        };
        let (mut state, mut data) = (State::default(), BTreeMap::new());
        settle(&mut state, &mut data, 0, &s);
        // 60 days are left, under two overlaps: stage now, not at day 60.
        assert_eq!(plan(&state, 30 * DAY + 1, &s), Step::Stage);
    }

    #[test]
    fn new_names_or_an_expired_certificate_are_issued_again_at_once() {
        let s = settings();
        let (mut state, mut data) = (State::default(), BTreeMap::new());
        settle(&mut state, &mut data, 0, &s);
        let mut renamed = s.clone();
        renamed.dns_names.push("webhook.example".into());
        assert_eq!(plan(&state, 10, &renamed), Step::Issue);
        assert_eq!(plan(&state, 90 * DAY, &s), Step::Issue);
        // Issuing keeps the CAs that are still valid (the old certificate may still be served).
        assert_eq!(settle(&mut state, &mut data, 10, &renamed), [Step::Issue]);
        assert_eq!(state.ca_not_after.len(), 2);
    }

    #[test]
    fn a_secret_without_state_is_issued_and_never_keeps_foreign_data_as_ours() {
        let mut data = BTreeMap::from([(CERT_KEY.to_owned(), ByteString(b"someone else's".to_vec()))]);
        let mut state = State::default();
        assert_eq!(settle(&mut state, &mut data, 5, &settings()), [Step::Issue]);
        assert!(String::from_utf8_lossy(&data[CERT_KEY].0).contains("BEGIN CERTIFICATE"));
    }

    #[test]
    fn the_served_certificate_is_signed_by_a_ca_in_the_bundle_for_its_names() {
        let s = settings();
        let (mut state, mut data) = (State::default(), BTreeMap::new());
        let now = jiff::Timestamp::now().as_second();
        settle(&mut state, &mut data, now, &s);
        let bundle = String::from_utf8_lossy(&data[CA_KEY].0).into_owned();
        let mut roots = rustls::RootCertStore::empty();
        for block in pem_blocks(&bundle) {
            let der = rustls::pki_types::CertificateDer::from_pem_slice(block.as_bytes()).unwrap();
            roots.add(der).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        let cert = rustls::pki_types::CertificateDer::from_pem_slice(&data[CERT_KEY].0).unwrap();
        let name = rustls::pki_types::ServerName::try_from(s.dns_names[0].clone()).unwrap();
        verifier
            .verify_server_cert(&cert, &[], &name, &[], rustls::pki_types::UnixTime::now())
            .unwrap();
    }
}
