//! The one rule for finding a field in a provider spec: Go `encoding/json`'s, because
//! machine-controller decodes every `cloudProviderSpec` with it.
//!
//! - **Names match case-insensitively.** A JSON key belongs to the struct field whose name it
//!   equals after Go's folding: ASCII letters fold to one case, and the two non-ASCII letters whose
//!   fold set holds an ASCII letter fold with it: `K` (U+212A KELVIN SIGN) with `k`, `ſ` (U+017F
//!   LATIN SMALL LETTER LONG S) with `s`. Every other non-ASCII letter folds to a non-ASCII letter,
//!   so it never matches the ASCII field names machine-controller uses. (Go prefers an exact match
//!   only when choosing between two *struct fields* that fold alike; no provider type has such a
//!   pair.)
//! - **The last matching key wins**, whether or not it is the exact spelling: the decoder assigns
//!   the field once per key, in document order (golang/go issues 43664, 11673 and 47984 show it).
//!   provider-sizes sees the object as the API server re-encodes it, keys sorted by bytes, which is
//!   also the order machine-controller reads (so `DiskSize` comes before, and loses to,
//!   `diskSize`).
//! - **Null** does nothing to a plain Go value (an `int`, a `string`, a struct): the earlier key
//!   stands ([`Null::Keep`]). It clears a pointer, slice or map and, for provider values
//!   (`ConfigVarString`), leaves nothing usable ([`Null::Reset`]).
//! - **Repeated objects merge**: a struct decoded twice keeps the fields the second object does
//!   not set. A path is therefore searched through every matching key in turn.
//!
//! A path is dotted field names; a name ending in `?` is a Go pointer, where a null drops what
//! earlier keys set (`virtualMachine.instancetype?.name`).

use serde_json::{Map, Value};

/// What a null at the end of a path does (the Go type of the field decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Null {
    /// A plain Go value: null is ignored, an earlier key's value stands.
    Keep,
    /// A pointer, slice, map or provider value: null leaves the field unset.
    Reset,
}

/// The result of a lookup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Found<'a> {
    /// No key matched (or only nulls that Go ignores).
    Absent,
    /// The winning key held null, or a pointer on the way was cleared.
    Null,
    Value(&'a Value),
}

impl<'a> Found<'a> {
    pub fn value(self) -> Option<&'a Value> {
        match self {
            Found::Value(v) => Some(v),
            Found::Absent | Found::Null => None,
        }
    }
}

/// A value on the path that should have been an object (Go refuses the whole spec then).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NotObject<'a> {
    /// The path up to and including the offending field, `?` markers removed.
    pub field: String,
    pub found: &'a Value,
}

/// Go's folding of one character, for comparing against ASCII field names.
fn fold(c: char) -> char {
    match c {
        'a'..='z' => c.to_ascii_uppercase(),
        '\u{212A}' => 'K',
        '\u{017F}' => 'S',
        _ => c,
    }
}

/// Whether JSON key `key` names the Go field whose JSON name is `name`.
pub(crate) fn matches(key: &str, name: &str) -> bool {
    let mut k = key.chars().map(fold);
    let mut n = name.chars().map(fold);
    loop {
        match (k.next(), n.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// The value of one field (no dots) of `object`, by the rule above.
pub(crate) fn get<'a>(object: &'a Map<String, Value>, name: &str, null: Null) -> Found<'a> {
    let mut found = Found::Absent;
    for (key, value) in object {
        if matches(key, name) {
            match value {
                Value::Null if null == Null::Keep => {}
                Value::Null => found = Found::Null,
                other => found = Found::Value(other),
            }
        }
    }
    found
}

/// The value at a dotted `path` of `object`; `leaf` says what a null at the end does.
pub(crate) fn find<'a>(
    object: &'a Map<String, Value>,
    path: &str,
    leaf: Null,
) -> Result<Found<'a>, NotObject<'a>> {
    let segments: Vec<&str> = path.split('.').collect();
    find_in(object, &segments, leaf)
}

fn find_in<'a>(
    object: &'a Map<String, Value>,
    segments: &[&str],
    leaf: Null,
) -> Result<Found<'a>, NotObject<'a>> {
    let Some((first, rest)) = segments.split_first() else {
        return Ok(Found::Absent);
    };
    let (name, pointer) = match first.strip_suffix('?') {
        Some(name) => (name, true),
        None => (*first, false),
    };
    if rest.is_empty() {
        let null = if pointer { Null::Reset } else { leaf };
        return Ok(get(object, name, null));
    }
    let mut found = Found::Absent;
    for (key, value) in object {
        if !matches(key, name) {
            continue;
        }
        match value {
            Value::Null if pointer => found = Found::Null,
            Value::Null => {}
            Value::Object(inner) => match find_in(inner, rest, leaf) {
                Ok(Found::Absent) => {}
                Ok(other) => found = other,
                Err(mut e) => {
                    e.field = format!("{name}.{}", e.field);
                    return Err(e);
                }
            },
            other => {
                return Err(NotObject {
                    field: name.to_owned(),
                    found: other,
                });
            }
        }
    }
    Ok(found)
}

/// The canonical spelling of a path for messages (`?` markers removed).
pub(crate) fn display(path: &str) -> String {
    path.replace('?', "")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn go_folding() {
        assert!(matches("diskSize", "diskSize"));
        assert!(matches("DiskSize", "diskSize"));
        assert!(matches("DISKSIZE", "diskSize"));
        assert!(matches("di\u{17F}k\u{17F}ize", "diskSize"));
        assert!(matches("\u{212A}ind", "kind"));
        assert!(!matches("disk_size", "diskSize"));
        assert!(!matches("diskSiz", "diskSize"));
        assert!(!matches("dïskSize", "diskSize"));
        assert!(!matches("", "a"));
    }

    #[test]
    fn last_match_wins_in_map_order() {
        // serde_json's map iterates sorted by bytes, as the API server writes keys.
        let o = obj(json!({"diskSize": 50, "DiskSize": 80}));
        assert_eq!(get(&o, "diskSize", Null::Keep), Found::Value(&json!(50)));
        let o = obj(json!({"DiskSize": 80}));
        assert_eq!(get(&o, "diskSize", Null::Keep), Found::Value(&json!(80)));
        let o = obj(json!({"DiskSize": 80, "diskSize": null}));
        assert_eq!(get(&o, "diskSize", Null::Keep), Found::Value(&json!(80)));
        assert_eq!(get(&o, "diskSize", Null::Reset), Found::Null);
    }

    #[test]
    fn repeated_objects_merge_and_pointers_reset() {
        let o = obj(json!({
            "VirtualMachine": {"template": {"cpus": "2"}},
            "virtualMachine": {"Template": {"memory": "4Gi"}}
        }));
        let cpus = find(&o, "virtualMachine.template.cpus", Null::Reset).unwrap();
        assert_eq!(cpus, Found::Value(&json!("2")));
        let o = obj(json!({"VM": {"instancetype": {"name": "a"}}, "vm": {"instancetype": null}}));
        assert_eq!(
            find(&o, "vm.instancetype?.name", Null::Reset).unwrap(),
            Found::Null
        );
        assert_eq!(
            find(&o, "vm.instancetype.name", Null::Reset).unwrap(),
            Found::Value(&json!("a"))
        );
        let o = obj(json!({"vm": {"template": 3}}));
        let e = find(&o, "vm.template.cpus", Null::Reset).unwrap_err();
        assert_eq!(e.field, "vm.template");
    }
}
