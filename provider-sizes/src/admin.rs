//! The admin-editable size catalog (YAML or JSON, from a `ConfigMap` key `catalog.yaml`).
//!
//! ```yaml
//! providers:
//!   openstack:
//!     m1.large: {cpu: 4, memory: 8Gi, storage: 80Gi}
//!   aws:
//!     m9.huge: {cpu: 96, memory: 384Gi}
//! rootDiskDefaults:
//!   vsphere: 40Gi
//! ```
//!
//! The full format is in the crate's README.

use std::fmt;

use kkp_quota_crds::Quantity;
use serde_json::Value;

use crate::catalog::{Flavour, SizeCatalog};
use crate::provider::Provider;

/// Why the admin catalog was refused. Names the entry and, where it can be found, the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct CatalogError {
    /// `providers.aws.m9.huge`, `rootDiskDefaults.vsphere`, ... (empty for whole-document errors).
    pub entry: String,
    /// 1-based line in the text, when known.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("admin size catalog")?;
        if !self.entry.is_empty() {
            write!(f, ", entry {}", self.entry)?;
        }
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// One admin entry, fields left out stay `None` (the shipped value is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdminSize {
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
    pub gpu: Option<Quantity>,
    pub storage: Option<Quantity>,
}

impl AdminSize {
    /// The flavour after applying this entry over `base`; `None` when cpu or memory is known
    /// from neither.
    pub(crate) fn merged_over(&self, base: Option<Flavour>) -> Option<Flavour> {
        Some(Flavour {
            cpu: self.cpu.or(base.map(|b| b.cpu))?,
            memory: self.memory.or(base.map(|b| b.memory))?,
            gpu: self.gpu.or(base.map(|b| b.gpu)).unwrap_or(Quantity::ZERO),
            disk: self.storage.or(base.and_then(|b| b.disk)),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AdminEntry {
    pub provider: Provider,
    pub flavour: String,
    pub size: AdminSize,
}

/// The admin-editable catalog. Parse it with [`AdminCatalog::parse`], apply it with
/// [`SizeCatalog::with_admin`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AdminCatalog {
    entries: Vec<AdminEntry>,
    root_disk_defaults: Vec<(Provider, Quantity)>,
}

/// A YAML scalar as text.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Finds the line of `key:` at or after `from` (0-based line index), matching plain or quoted
/// keys. Good enough to point an admin at the entry; `None` when not found.
fn find_key_line(text: &str, key: &str, from: usize) -> Option<usize> {
    let candidates = [
        format!("{key}:"),
        format!("\"{key}\":"),
        format!("'{key}':"),
        format!("\"{key}\" :"),
    ];
    text.lines().enumerate().skip(from).find_map(|(i, line)| {
        let trimmed = line.trim_start().trim_start_matches(['{', ',', ' ']);
        candidates
            .iter()
            .any(|c| {
                trimmed.starts_with(c.as_str())
                    || line.contains(&format!(" {c}"))
                    || line.contains(&format!("{{{c}"))
            })
            .then_some(i)
    })
}

struct Parser<'t> {
    text: &'t str,
}

impl Parser<'_> {
    fn error(&self, entry: String, path: &[&str], message: impl Into<String>) -> CatalogError {
        let mut line = None;
        let mut from = 0;
        for key in path {
            match find_key_line(self.text, key, from) {
                Some(found) => {
                    line = Some(found + 1);
                    from = found;
                }
                None => break,
            }
        }
        CatalogError {
            entry,
            line,
            message: message.into(),
        }
    }

    fn quantity(
        &self,
        entry: &str,
        path: &[&str],
        field: &str,
        value: &Value,
    ) -> Result<Quantity, CatalogError> {
        let text = scalar_text(value).ok_or_else(|| {
            self.error(
                entry.to_owned(),
                path,
                format!(
                    "{field} must be a quantity (e.g. 8Gi or 4), found {}",
                    describe(value)
                ),
            )
        })?;
        let quantity: Quantity = text
            .trim()
            .parse()
            .map_err(|e| self.error(entry.to_owned(), path, format!("{field}: {e}")))?;
        if quantity.is_negative() {
            return Err(self.error(
                entry.to_owned(),
                path,
                format!("{field} must not be negative, found {text}"),
            ));
        }
        Ok(quantity)
    }

    fn provider(&self, section: &str, key: &str) -> Result<(Provider, String), CatalogError> {
        let name = key.to_owned();
        let provider = Provider::from_name(&name).ok_or_else(|| {
            self.error(
                format!("{section}.{name}"),
                &[section, &name],
                format!(
                    "unknown provider {name:?}; use one of {}",
                    Provider::NAMES.join(", ")
                ),
            )
        })?;
        Ok((provider, name))
    }

    fn size(&self, entry: &str, path: &[&str], value: &Value) -> Result<AdminSize, CatalogError> {
        let Value::Object(fields) = value else {
            return Err(self.error(
                entry.to_owned(),
                path,
                format!(
                    "expected a mapping like {{cpu: 4, memory: 8Gi}}, found {}",
                    describe(value)
                ),
            ));
        };
        let mut size = AdminSize::default();
        for (key, value) in fields {
            let field = key.clone();
            let slot = match field.as_str() {
                "cpu" => &mut size.cpu,
                "memory" => &mut size.memory,
                "gpu" => &mut size.gpu,
                "storage" => &mut size.storage,
                _ => {
                    return Err(self.error(
                        entry.to_owned(),
                        path,
                        format!("unknown field {field:?}; an entry has cpu, memory, storage and gpu"),
                    ));
                }
            };
            *slot = Some(self.quantity(entry, path, &field, value)?);
        }
        Ok(size)
    }
}

impl AdminCatalog {
    /// Parses the catalog text (YAML, of which JSON is a subset). Empty text is an empty catalog.
    ///
    /// A flavour that is not in the shipped catalog must give `cpu` and `memory`; a flavour that
    /// is may give only the fields it changes.
    pub fn parse(text: &str) -> Result<AdminCatalog, CatalogError> {
        let parser = Parser { text };
        // YAML is read into a JSON value (every key a string): the catalog needs no YAML-only
        // feature, and a duplicate key is an error that names its line.
        let root: Value = serde_saphyr::from_str(text).map_err(|e| CatalogError {
            entry: String::new(),
            line: e
                .location()
                .and_then(|l| usize::try_from(l.line()).ok())
                .filter(|l| *l > 0),
            message: e.to_string(),
        })?;
        let mut catalog = AdminCatalog::default();
        let top = match root {
            Value::Null => return Ok(catalog),
            Value::Object(top) => top,
            other => {
                return Err(CatalogError {
                    entry: String::new(),
                    line: Some(1),
                    message: format!(
                        "expected a mapping with providers and rootDiskDefaults, found {}",
                        describe(&other)
                    ),
                });
            }
        };
        let shipped = SizeCatalog::shipped();
        for (key, value) in &top {
            let section = key.clone();
            match section.as_str() {
                "providers" => catalog.parse_providers(&parser, &shipped, value)?,
                "rootDiskDefaults" => {
                    let Value::Object(defaults) = value else {
                        if value.is_null() {
                            continue;
                        }
                        return Err(parser.error(
                            section.clone(),
                            &[&section],
                            "expected a mapping provider: size",
                        ));
                    };
                    for (key, value) in defaults {
                        let (provider, name) = parser.provider("rootDiskDefaults", key)?;
                        let entry = format!("rootDiskDefaults.{name}");
                        let size = parser.quantity(&entry, &["rootDiskDefaults", &name], "size", value)?;
                        catalog.root_disk_defaults.push((provider, size));
                    }
                }
                _ => {
                    return Err(parser.error(
                        section.clone(),
                        &[&section],
                        format!(
                            "unknown section {section:?}; the catalog has providers and rootDiskDefaults"
                        ),
                    ));
                }
            }
        }
        Ok(catalog)
    }

    fn parse_providers(
        &mut self,
        parser: &Parser<'_>,
        shipped: &SizeCatalog,
        value: &Value,
    ) -> Result<(), CatalogError> {
        let providers = match value {
            Value::Null => return Ok(()),
            Value::Object(providers) => providers,
            other => {
                return Err(parser.error(
                    "providers".into(),
                    &["providers"],
                    format!("expected a mapping of providers, found {}", describe(other)),
                ));
            }
        };
        for (key, flavours) in providers {
            let (provider, name) = parser.provider("providers", key)?;
            let flavours = match flavours {
                Value::Null => continue,
                Value::Object(flavours) => flavours,
                other => {
                    return Err(parser.error(
                        format!("providers.{name}"),
                        &["providers", &name],
                        format!("expected a mapping of flavour: size, found {}", describe(other)),
                    ));
                }
            };
            for (key, size) in flavours {
                let Some(flavour) = Some(key.clone()).filter(|f| !f.is_empty()) else {
                    return Err(parser.error(
                        format!("providers.{name}"),
                        &["providers", &name],
                        "a flavour name must be a non-empty string",
                    ));
                };
                let entry = format!("providers.{name}.{flavour}");
                let path = ["providers", name.as_str(), flavour.as_str()];
                let size = parser.size(&entry, &path, size)?;
                if size
                    .merged_over(shipped.flavour(provider, &flavour).copied())
                    .is_none()
                {
                    return Err(parser.error(
                        entry,
                        &path,
                        "cpu and memory are required for a flavour that is not in the shipped catalog",
                    ));
                }
                let normalised = provider.normalise_key(&flavour).into_owned();
                if self
                    .entries
                    .iter()
                    .any(|e| e.provider == provider && provider.normalise_key(&e.flavour) == normalised)
                {
                    return Err(parser.error(entry, &path, "duplicate entry"));
                }
                self.entries.push(AdminEntry {
                    provider,
                    flavour,
                    size,
                });
            }
        }
        Ok(())
    }

    pub(crate) fn entries(&self) -> &[AdminEntry] {
        &self.entries
    }

    pub(crate) fn root_disk_defaults(&self) -> impl Iterator<Item = (Provider, Quantity)> + '_ {
        self.root_disk_defaults.iter().copied()
    }

    /// Number of flavour entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.root_disk_defaults.is_empty()
    }
}
