//! The one duration format of every binary's flags: `500ms`, `30s`, `2m`, `1h30m` (jiff's
//! friendly format), so that no flag takes bare seconds and another milliseconds.

use std::time::Duration;

/// A duration flag's value; negative ones are refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = parse_signed_duration(text)?;
    Duration::try_from(d).map_err(|e| format!("{text:?}: {e}"))
}

/// A duration flag's value that may be negative (`-40s`).
pub fn parse_signed_duration(text: &str) -> Result<jiff::SignedDuration, String> {
    text.parse()
        .map_err(|e| format!("{text:?} is not a duration such as 500ms, 30s, 2m or 1h: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_the_usual_units() {
        assert_eq!(parse_duration("2m"), Ok(Duration::from_mins(2)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_hours(1)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("120").is_err(), "a bare number has no unit");
        assert!(parse_duration("-5s").is_err());
        assert_eq!(
            parse_signed_duration("-40s"),
            Ok(jiff::SignedDuration::from_secs(-40))
        );
    }
}
