//! Reading provider values as machine-controller does: fields found by [`crate::field`]'s rule,
//! Go integers as JSON numbers, provider values (`ConfigVarString`) as strings, numbers or
//! `{value, secretKeyRef, configMapKeyRef}` references.

use std::borrow::Cow;

use kkp_quota_crds::Quantity;
use kkp_quota_crds::machine::GlobalKeyRef;
use serde_json::{Map, Value};

use crate::error::{SizingError, SizingErrorKind};
use crate::field::{self, Found, Null};
use crate::provider::Provider;

/// A provider value given by reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueRef {
    Secret(GlobalKeyRef),
    ConfigMap(GlobalKeyRef),
}

impl ValueRef {
    /// `Secret` or `ConfigMap`.
    pub fn kind(&self) -> &'static str {
        match self {
            ValueRef::Secret(_) => "Secret",
            ValueRef::ConfigMap(_) => "ConfigMap",
        }
    }

    pub fn key_ref(&self) -> &GlobalKeyRef {
        match self {
            ValueRef::Secret(r) | ValueRef::ConfigMap(r) => r,
        }
    }
}

/// Why a referenced value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The `Secret` or `ConfigMap` is not there (or not in the resolver's cache).
    #[error("{kind} {namespace}/{name} not found")]
    NotFound {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    /// It is there, without the key.
    #[error("{kind} {namespace}/{name} has no key {key:?}")]
    NoKey {
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
}

impl ResolveError {
    pub fn not_found(reference: &ValueRef) -> ResolveError {
        let r = reference.key_ref();
        ResolveError::NotFound {
            kind: reference.kind(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        }
    }

    pub fn no_key(reference: &ValueRef) -> ResolveError {
        let r = reference.key_ref();
        ResolveError::NoKey {
            kind: reference.kind(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            key: r.key.clone(),
        }
    }
}

/// Resolves referenced provider values. Supplied by the caller, from a cache: never a network
/// call on the admission path.
pub trait ValueResolver: Send + Sync {
    fn resolve(&self, reference: &ValueRef) -> Result<String, ResolveError>;
}

pub(crate) fn json_kind(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.len() > 40 => "a long string".into(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// One Machine's `cloudProviderSpec`, with the means to read its values. Every read goes through
/// [`crate::field`], machine-controller's (Go `encoding/json`'s) rule for finding a field.
pub(crate) struct Spec<'a> {
    pub provider: Provider,
    pub name: &'a str,
    pub object: &'a Map<String, Value>,
    pub resolver: Option<&'a dyn ValueResolver>,
    /// `spec.providerSpec.value.operatingSystem`, when given.
    pub operating_system: Option<&'a str>,
    /// Prefix of field names in messages (`disks[0].`) when reading a list item.
    pub prefix: String,
}

const NUMBER: &str = "a JSON number such as 50 (machine-controller reads this field as a plain \
                      number: a string or {value, secretKeyRef} is refused there too)";

impl<'a> Spec<'a> {
    /// The same Machine, reading inside one object of a list (`disks[0]`).
    pub fn item(&self, object: &'a Map<String, Value>, prefix: String) -> Spec<'a> {
        Spec {
            provider: self.provider,
            name: self.name,
            object,
            resolver: self.resolver,
            operating_system: self.operating_system,
            prefix,
        }
    }

    fn field_name(&self, path: &str) -> String {
        format!("{}{}", self.prefix, field::display(path))
    }

    pub fn error(&self, kind: SizingErrorKind) -> SizingError {
        SizingError::new(self.name, kind)
    }

    pub fn invalid(&self, field: &str, expected: &'static str, found: &Value) -> SizingError {
        self.error(SizingErrorKind::InvalidField {
            field: self.field_name(field),
            expected,
            found: json_kind(found),
        })
    }

    pub fn missing(&self, field: &str, hint: &'static str) -> SizingError {
        self.error(SizingErrorKind::MissingField {
            field: self.field_name(field),
            hint,
        })
    }

    pub fn overflow(&self, field: &str) -> SizingError {
        self.error(SizingErrorKind::Overflow {
            field: self.field_name(field),
        })
    }

    /// The value at a dotted path; `None` when missing or null (as `null` says), an error when a
    /// value on the way is not an object.
    pub fn lookup(&self, path: &str, null: Null) -> Result<Option<&'a Value>, SizingError> {
        field::find(self.object, path, null)
            .map(Found::value)
            .map_err(|e| self.invalid(&e.field, "an object", e.found))
    }

    /// Whether a field is set (present and not null), e.g. a pointer such as `instancetype`.
    pub fn is_set(&self, path: &str) -> Result<bool, SizingError> {
        Ok(self.lookup(path, Null::Reset)?.is_some())
    }

    /// A list (Go slice: a null clears it).
    pub fn list(&self, path: &str) -> Result<Option<&'a Vec<Value>>, SizingError> {
        match self.lookup(path, Null::Reset)? {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(self.invalid(path, "a list", other)),
        }
    }

    /// A provider value (Go `ConfigVarString`) as text: a string as is, a number or boolean as
    /// written, `{value, secretKeyRef, configMapKeyRef}` resolved. Empty counts as unset, as in
    /// machine-controller.
    pub fn text_of(&self, path: &str, value: &'a Value) -> Result<Option<Cow<'a, str>>, SizingError> {
        let text = match value {
            Value::Null => None,
            Value::String(s) => Some(Cow::Borrowed(s.as_str())),
            Value::Number(n) => Some(Cow::Owned(n.to_string())),
            Value::Bool(_) | Value::Array(_) => {
                return Err(self.invalid(
                    path,
                    "a string, a number or {value|secretKeyRef|configMapKeyRef}",
                    value,
                ));
            }
            Value::Object(object) => return self.resolve_ref(path, object),
        };
        Ok(text.filter(|t| !t.is_empty()))
    }

    /// One `{namespace, name, key}` reference, read as Go reads it; `None` unless all three are
    /// non-empty strings (machine-controller ignores an incomplete reference).
    fn key_ref(
        &self,
        path: &str,
        object: &'a Map<String, Value>,
        which: &str,
    ) -> Result<Option<GlobalKeyRef>, SizingError> {
        let reference = match field::get(object, which, Null::Reset) {
            Found::Value(Value::Object(r)) => r,
            Found::Absent | Found::Null => return Ok(None),
            Found::Value(other) => {
                return Err(self.invalid(&format!("{path}.{which}"), "{namespace, name, key}", other));
            }
        };
        let mut parts = [String::new(), String::new(), String::new()];
        for (slot, name) in parts.iter_mut().zip(["namespace", "name", "key"]) {
            match field::get(reference, name, Null::Keep) {
                Found::Value(Value::String(s)) => s.clone_into(slot),
                Found::Absent | Found::Null => {}
                Found::Value(other) => {
                    return Err(self.invalid(&format!("{path}.{which}.{name}"), "a string", other));
                }
            }
        }
        let [namespace, name, key] = parts;
        if namespace.is_empty() || name.is_empty() || key.is_empty() {
            return Ok(None);
        }
        Ok(Some(GlobalKeyRef { namespace, name, key }))
    }

    /// machine-controller's order: a complete `secretKeyRef`, else a complete
    /// `configMapKeyRef`, else `value` (a string).
    fn resolve_ref(
        &self,
        path: &str,
        object: &'a Map<String, Value>,
    ) -> Result<Option<Cow<'a, str>>, SizingError> {
        let target = match self.key_ref(path, object, "secretKeyRef")? {
            Some(secret) => Some(ValueRef::Secret(secret)),
            None => self
                .key_ref(path, object, "configMapKeyRef")?
                .map(ValueRef::ConfigMap),
        };
        let Some(target) = target else {
            return match field::get(object, "value", Null::Keep) {
                Found::Absent | Found::Null => Ok(None),
                Found::Value(Value::String(s)) => Ok((!s.is_empty()).then_some(Cow::Borrowed(s.as_str()))),
                Found::Value(other) => Err(self.invalid(
                    &format!("{path}.value"),
                    "a string (machine-controller refuses a number or anything else here)",
                    other,
                )),
            };
        };
        let Some(resolver) = self.resolver else {
            return Err(self.error(SizingErrorKind::NoResolver {
                field: self.field_name(path),
            }));
        };
        let text = resolver.resolve(&target).map_err(|cause| {
            self.error(SizingErrorKind::ResolveFailed {
                field: self.field_name(path),
                cause: Box::new(cause),
            })
        })?;
        let text = text.trim();
        Ok((!text.is_empty()).then(|| Cow::Owned(text.to_owned())))
    }

    /// A provider value (`ConfigVarString`) at `path`.
    pub fn text(&self, path: &str) -> Result<Option<Cow<'a, str>>, SizingError> {
        match self.lookup(path, Null::Reset)? {
            None => Ok(None),
            Some(value) => self.text_of(path, value),
        }
    }

    /// A required flavour-like text value.
    pub fn required_text(&self, path: &str, hint: &'static str) -> Result<Cow<'a, str>, SizingError> {
        self.text(path)?.ok_or_else(|| self.missing(path, hint))
    }

    /// A provider value holding a whole number (Alibaba's `diskSize`): text, then digits.
    pub fn int_text(&self, path: &str) -> Result<Option<i64>, SizingError> {
        let Some(value) = self.lookup(path, Null::Reset)? else {
            return Ok(None);
        };
        let Some(text) = self.text_of(path, value)? else {
            return Ok(None);
        };
        let text = text.trim();
        match text.parse::<i64>() {
            Ok(i) if i >= 0 => Ok(Some(i)),
            Err(_) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                Err(self.overflow(path))
            }
            _ => Err(self.invalid(path, "a non-negative whole number", value)),
        }
    }

    /// A Go integer field: a JSON number, whole and not negative. An integral float (`50.0`) is
    /// taken too: the API server re-encodes it as `50` before machine-controller reads it.
    pub fn int_of(&self, path: &str, value: &'a Value) -> Result<Option<i64>, SizingError> {
        let Value::Number(n) = value else {
            return match value {
                Value::Null => Ok(None),
                other => Err(self.invalid(path, NUMBER, other)),
            };
        };
        let number = if let Some(i) = n.as_i64() {
            i
        } else if n.as_u64().is_some() {
            return Err(self.overflow(path));
        } else {
            match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                    #[allow(clippy::cast_possible_truncation)] // integral and well inside i64
                    let i = f as i64;
                    i
                }
                Some(f) if f.fract() == 0.0 => return Err(self.overflow(path)),
                _ => return Err(self.invalid(path, "a non-negative whole number", value)),
            }
        };
        if number < 0 {
            return Err(self.invalid(path, "a non-negative whole number", value));
        }
        Ok(Some(number))
    }

    /// A Go integer at `path`: `Null::Keep` for a plain `int`, `Null::Reset` for a `*int`.
    pub fn int(&self, path: &str, null: Null) -> Result<Option<i64>, SizingError> {
        match self.lookup(path, null)? {
            None => Ok(None),
            Some(value) => self.int_of(path, value),
        }
    }

    /// A required Go integer (plain `int`); missing and zero are both refused.
    pub fn required_positive(&self, path: &str, hint: &'static str) -> Result<i64, SizingError> {
        match self.int(path, Null::Keep)? {
            Some(n) if n > 0 => Ok(n),
            _ => Err(self.missing(path, hint)),
        }
    }

    /// A Kubernetes quantity given as a provider value (`4Gi`, `500m`, `2`).
    pub fn quantity_of(&self, path: &str, value: &'a Value) -> Result<Option<Quantity>, SizingError> {
        if matches!(value, Value::Bool(_) | Value::Array(_)) {
            return Err(self.invalid(path, "a Kubernetes quantity such as 4Gi or 2", value));
        }
        let Some(text) = self.text_of(path, value)? else {
            return Ok(None);
        };
        let quantity: Quantity = text
            .trim()
            .parse()
            .map_err(|_| self.invalid(path, "a Kubernetes quantity such as 4Gi or 2", value))?;
        if quantity.is_negative() {
            return Err(self.invalid(path, "a non-negative quantity", value));
        }
        Ok(Some(quantity))
    }

    pub fn quantity(&self, path: &str) -> Result<Option<Quantity>, SizingError> {
        match self.lookup(path, Null::Reset)? {
            None => Ok(None),
            Some(value) => self.quantity_of(path, value),
        }
    }

    /// `count` × `unit` bytes (or units), checked.
    pub fn scaled(&self, field: &str, count: i64, unit: i64) -> Result<Quantity, SizingError> {
        Quantity::from_units(count)
            .checked_mul(unit)
            .map_err(|_| self.overflow(field))
    }

    pub fn add(&self, field: &str, a: Quantity, b: Quantity) -> Result<Quantity, SizingError> {
        a.checked_add(b).map_err(|_| self.overflow(field))
    }
}
