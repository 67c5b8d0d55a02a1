//! Durations as the components' flags take them: Go's syntax (`90s`, `3m`, `1h30m`), positive.

use std::time::Duration;

/// A Go duration flag (`90s`, `3m`, `1h30m`), positive.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d: k8s_openapi::jiff::SignedDuration = text
        .trim()
        .parse()
        .map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    match Duration::try_from(d) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(format!("invalid duration {text:?}: must be positive")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
