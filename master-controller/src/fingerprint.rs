//! Fingerprints: what this process remembers of a body instead of the body.

/// A hash of a JSON body, to tell whether a body differs from the last one seen.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Fingerprint(u64);

impl Fingerprint {
    pub fn of(body: &serde_json::Value) -> Fingerprint {
        use std::hash::{DefaultHasher, Hash, Hasher};
        // `DefaultHasher::new()` has fixed keys: the same body hashes the same in this process,
        // which is all this memory needs (it is never persisted).
        let mut hasher = DefaultHasher::new();
        body.to_string().hash(&mut hasher);
        Fingerprint(hasher.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprints_tell_bodies_apart() {
        let body = json!({"spec": {"quota": {"cpu": "4"}}});
        assert_eq!(Fingerprint::of(&body), Fingerprint::of(&body.clone()));
        assert_ne!(
            Fingerprint::of(&body),
            Fingerprint::of(&json!({"spec": {"quota": {"cpu": "5"}}}))
        );
    }
}
