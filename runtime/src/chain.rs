//! An error and each of its causes on one line, for logs: typed errors keep their source out of
//! their own message, so that each cause is printed once.

use std::fmt;

/// Displays `error: cause: cause of the cause ...`.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;

    #[derive(Debug, thiserror::Error)]
    #[error("reading the catalog")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn each_cause_once_in_order() {
        let error = Outer(std::io::Error::other("disk on fire"));
        assert_eq!(Chain(&error).to_string(), "reading the catalog: disk on fire");
    }
}
