//! Everything the plugin reads: the cluster's quota objects, the manifest, the admin catalog.

use std::io::Read as _;
use std::path::Path;

use kkp_quota_crds::{ProjectQuota, QuotaView};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use provider_sizes::{AdminCatalog, SizeCatalog};

use crate::Error;

/// The quota objects of the cluster the plugin talks to.
#[derive(Clone, Debug)]
pub enum Quotas {
    /// A user cluster: its project's view (one, unless the cluster changed project lately).
    Views(Vec<QuotaView>),
    /// The master: every project's quota.
    Master(Vec<ProjectQuota>),
}

/// A client for `kubeconfig` (or kubectl's default) and `context` (or its current one).
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, Error> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|source| Error::KubeconfigFile {
                path: path.to_owned(),
                source,
            })?;
            Config::from_custom_kubeconfig(file, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(Error::Kubeconfig)?;
    Client::try_from(config).map_err(Error::Client)
}

/// The cluster's `QuotaView`s; where it has none, the master's `ProjectQuota`s. A cluster may
/// serve both kinds (every CRD installed, as in the local fleet): the one with objects wins, and
/// an empty view list stands when `ProjectQuota`s cannot be read here (a user's cluster).
pub async fn quotas(client: &Client) -> Result<Quotas, Error> {
    let views = match Api::<QuotaView>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) if !list.items.is_empty() => return Ok(Quotas::Views(list.items)),
        Ok(_) => Some(Vec::new()),
        Err(e) if not_served(&e) => None,
        Err(e) => {
            return Err(Error::Kube {
                what: "the QuotaViews",
                source: e,
            });
        }
    };
    match Api::<ProjectQuota>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(Quotas::Master(list.items)),
        Err(e) => match (views, not_served(&e) || forbidden(&e)) {
            (Some(none), true) => Ok(Quotas::Views(none)),
            (None, true) => Err(Error::NoQuotaHere),
            (_, false) => Err(Error::Kube {
                what: "the ProjectQuotas",
                source: e,
            }),
        },
    }
}

fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 403)
}

/// A 404 on a list: the API server does not serve the resource (its CRD is not installed).
fn not_served(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 404)
}

/// The manifest's text; `-` is standard input.
pub fn file(path: &Path) -> Result<String, Error> {
    let failed = |source| Error::File {
        path: path.to_owned(),
        source,
    };
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(failed)?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).map_err(failed)
    }
}

/// The catalog the webhook sizes with: the shipped one, plus the admin catalog when given.
pub fn catalog(admin: Option<&Path>) -> Result<SizeCatalog, Error> {
    let Some(path) = admin else {
        return Ok(SizeCatalog::shipped());
    };
    let text = file(path)?;
    let admin = AdminCatalog::parse(&text).map_err(|source| Error::Catalog {
        path: path.to_owned(),
        source,
    })?;
    Ok(SizeCatalog::shipped().with_admin(&admin))
}
