//! Reading provider values: plain JSON, numbers as strings, and `{value, secretKeyRef,
//! configMapKeyRef}` references.

use std::borrow::Cow;

use kkp_quota_crds::Quantity;
use kkp_quota_crds::machine::{ConfigValueRef, GlobalKeyRef};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{SizingError, SizingErrorKind};
use crate::provider::Provider;

/// A provider value given by reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueRef {
    Secret(GlobalKeyRef),
    ConfigMap(GlobalKeyRef),
}

/// Resolves referenced provider values. Supplied by the caller, from a cache: never a network
/// call on the admission path.
pub trait ValueResolver: Send + Sync {
    fn resolve(&self, reference: &ValueRef) -> Result<String, String>;
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

/// One Machine's `cloudProviderSpec`, with the means to read its values.
pub(crate) struct Spec<'a> {
    pub provider: Provider,
    pub name: &'a str,
    pub object: &'a Map<String, Value>,
    pub resolver: Option<&'a dyn ValueResolver>,
}

impl<'a> Spec<'a> {
    pub fn error(&self, kind: SizingErrorKind) -> SizingError {
        SizingError::new(self.name, kind)
    }

    pub fn invalid(&self, field: &str, expected: &'static str, found: &Value) -> SizingError {
        self.error(SizingErrorKind::InvalidField {
            field: field.to_owned(),
            expected,
            found: json_kind(found),
        })
    }

    pub fn missing(&self, field: &str, hint: &'static str) -> SizingError {
        self.error(SizingErrorKind::MissingField {
            field: field.to_owned(),
            hint,
        })
    }

    pub fn overflow(&self, field: &str) -> SizingError {
        self.error(SizingErrorKind::Overflow {
            field: field.to_owned(),
        })
    }

    /// The value at a dotted path (`virtualMachine.template.cpus`); `None` when it or a parent is
    /// missing or null, an error when a parent is not an object.
    pub fn lookup(&self, path: &str) -> Result<Option<&'a Value>, SizingError> {
        let mut object = self.object;
        let mut parts = path.split('.').peekable();
        let mut walked = 0;
        while let Some(part) = parts.next() {
            walked += part.len() + 1;
            let value = match object.get(part) {
                None | Some(Value::Null) => return Ok(None),
                Some(value) => value,
            };
            if parts.peek().is_none() {
                return Ok(Some(value));
            }
            match value {
                Value::Object(inner) => object = inner,
                other => return Err(self.invalid(&path[..walked - 1], "an object", other)),
            }
        }
        Ok(None)
    }

    /// A scalar provider value as text: strings as is, numbers and booleans printed, references
    /// resolved. Empty strings count as unset, as in machine-controller.
    pub fn text_of(&self, field: &str, value: &'a Value) -> Result<Option<Cow<'a, str>>, SizingError> {
        let text = match value {
            Value::Null => None,
            Value::String(s) => Some(Cow::Borrowed(s.as_str())),
            Value::Number(n) => Some(Cow::Owned(n.to_string())),
            Value::Bool(_) | Value::Array(_) => {
                return Err(self.invalid(
                    field,
                    "a string, a number or {value|secretKeyRef|configMapKeyRef}",
                    value,
                ));
            }
            Value::Object(_) => return self.resolve_ref(field, value),
        };
        Ok(text.filter(|t| !t.is_empty()))
    }

    fn resolve_ref(&self, field: &str, value: &'a Value) -> Result<Option<Cow<'a, str>>, SizingError> {
        let expected = "{value, secretKeyRef: {namespace, name, key}, configMapKeyRef: {...}}";
        let reference =
            ConfigValueRef::deserialize(value).map_err(|_| self.invalid(field, expected, value))?;
        if let Some(inline) = value.get("value") {
            match inline {
                Value::Null => {}
                Value::String(s) if s.is_empty() => {}
                Value::String(s) => return Ok(Some(Cow::Borrowed(s.as_str()))),
                Value::Number(n) => return Ok(Some(Cow::Owned(n.to_string()))),
                other => return Err(self.invalid(&format!("{field}.value"), "a string or a number", other)),
            }
        }
        let target = match (reference.secret_key_ref, reference.config_map_key_ref) {
            (Some(secret), _) => ValueRef::Secret(secret),
            (None, Some(config_map)) => ValueRef::ConfigMap(config_map),
            (None, None) => {
                if value.as_object().is_some_and(Map::is_empty) {
                    return Ok(None);
                }
                return Err(self.invalid(field, expected, value));
            }
        };
        let Some(resolver) = self.resolver else {
            return Err(self.error(SizingErrorKind::NoResolver {
                field: field.to_owned(),
            }));
        };
        let text = resolver.resolve(&target).map_err(|message| {
            self.error(SizingErrorKind::ResolveFailed {
                field: field.to_owned(),
                message,
            })
        })?;
        let text = text.trim();
        Ok((!text.is_empty()).then(|| Cow::Owned(text.to_owned())))
    }

    /// A text value at `path`.
    pub fn text(&self, path: &str) -> Result<Option<Cow<'a, str>>, SizingError> {
        match self.lookup(path)? {
            None => Ok(None),
            Some(value) => self.text_of(path, value),
        }
    }

    /// A required flavour-like text value.
    pub fn required_text(&self, path: &str, hint: &'static str) -> Result<Cow<'a, str>, SizingError> {
        self.text(path)?.ok_or_else(|| self.missing(path, hint))
    }

    /// A whole, non-negative number: JSON integer, integral float, or a string of digits (or a
    /// reference to one).
    pub fn int_of(&self, field: &str, value: &'a Value) -> Result<Option<i64>, SizingError> {
        const EXPECTED: &str = "a non-negative whole number";
        let number = if let Value::Number(n) = value {
            if let Some(i) = n.as_i64() {
                i
            } else if n.as_u64().is_some() {
                return Err(self.overflow(field));
            } else {
                // An integral float (`50.0`), as YAML and some clients write numbers.
                match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                        #[allow(clippy::cast_possible_truncation)] // integral and well inside i64
                        let i = f as i64;
                        i
                    }
                    Some(f) if f.fract() == 0.0 => return Err(self.overflow(field)),
                    _ => return Err(self.invalid(field, EXPECTED, value)),
                }
            }
        } else if matches!(value, Value::Bool(_) | Value::Array(_)) {
            return Err(self.invalid(field, EXPECTED, value));
        } else {
            let Some(text) = self.text_of(field, value)? else {
                return Ok(None);
            };
            let text = text.trim();
            match text.parse::<i64>() {
                Ok(i) => i,
                Err(_) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                    return Err(self.overflow(field));
                }
                Err(_) => return Err(self.invalid(field, EXPECTED, value)),
            }
        };
        if number < 0 {
            return Err(self.invalid(field, EXPECTED, value));
        }
        Ok(Some(number))
    }

    /// A whole number at `path`; `None` when missing, null or empty.
    pub fn int(&self, path: &str) -> Result<Option<i64>, SizingError> {
        match self.lookup(path)? {
            None => Ok(None),
            Some(value) => self.int_of(path, value),
        }
    }

    /// A required whole number; missing and zero are both refused.
    pub fn required_positive(&self, path: &str, hint: &'static str) -> Result<i64, SizingError> {
        match self.int(path)? {
            Some(n) if n > 0 => Ok(n),
            _ => Err(self.missing(path, hint)),
        }
    }

    /// A Kubernetes quantity (`4Gi`, `500m`, `2`), as a string, a number or a reference.
    pub fn quantity_of(&self, field: &str, value: &'a Value) -> Result<Option<Quantity>, SizingError> {
        if matches!(value, Value::Bool(_) | Value::Array(_)) {
            return Err(self.invalid(field, "a Kubernetes quantity such as 4Gi or 2", value));
        }
        let Some(text) = self.text_of(field, value)? else {
            return Ok(None);
        };
        let quantity: Quantity = text
            .trim()
            .parse()
            .map_err(|_| self.invalid(field, "a Kubernetes quantity such as 4Gi or 2", value))?;
        if quantity.is_negative() {
            return Err(self.invalid(field, "a non-negative quantity", value));
        }
        Ok(Some(quantity))
    }

    pub fn quantity(&self, path: &str) -> Result<Option<Quantity>, SizingError> {
        match self.lookup(path)? {
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
