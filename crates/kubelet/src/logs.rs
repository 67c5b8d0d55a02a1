//! Container log options (`/containerLogs/{ns}/{pod}/{container}?...`), parsed and validated as
//! the kubelet does (`PodLogOptions`), with 400 and the reason for bad values.

/// Options of a log request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep streaming new lines.
    pub follow: bool,
    /// The previous (terminated) instance of the container.
    pub previous: bool,
    /// Prefix each line with its RFC 3339 timestamp.
    pub timestamps: bool,
    /// Only lines newer than this many seconds.
    pub since_seconds: Option<i64>,
    /// Only lines newer than this time (RFC 3339).
    pub since_time: Option<String>,
    /// Only the last N lines.
    pub tail_lines: Option<i64>,
    /// At most this many bytes.
    pub limit_bytes: Option<i64>,
}

/// A log request the kubelet refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LogOptionsError(pub String);

/// Go's `strconv.ParseBool`.
fn parse_bool(key: &str, v: &str) -> Result<bool, LogOptionsError> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(LogOptionsError(format!(
            "invalid value {v:?} for {key}: must be a boolean"
        ))),
    }
}

fn parse_int(key: &str, v: &str) -> Result<i64, LogOptionsError> {
    v.parse()
        .map_err(|_| LogOptionsError(format!("invalid value {v:?} for {key}: must be an integer")))
}

impl LogOptions {
    /// Parses a query string.
    pub fn from_query(query: Option<&str>) -> Result<Self, LogOptionsError> {
        let mut o = Self::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match k.as_ref() {
                "follow" => o.follow = parse_bool("follow", &v)?,
                "previous" => o.previous = parse_bool("previous", &v)?,
                "timestamps" => o.timestamps = parse_bool("timestamps", &v)?,
                "sinceSeconds" => o.since_seconds = Some(parse_int("sinceSeconds", &v)?),
                "sinceTime" => {
                    if v.parse::<k8s_openapi::jiff::Timestamp>().is_err() {
                        return Err(LogOptionsError(format!(
                            "invalid value {v:?} for sinceTime: must be an RFC 3339 time"
                        )));
                    }
                    o.since_time = Some(v.into_owned());
                }
                "tailLines" | "tail" => o.tail_lines = Some(parse_int("tailLines", &v)?),
                "limitBytes" => o.limit_bytes = Some(parse_int("limitBytes", &v)?),
                _ => {}
            }
        }
        o.validate()?;
        Ok(o)
    }

    fn validate(&self) -> Result<(), LogOptionsError> {
        if self.tail_lines.is_some_and(|t| t < 0) {
            return Err(LogOptionsError(
                "tailLines: Invalid value: must be greater than or equal to 0".into(),
            ));
        }
        if self.limit_bytes.is_some_and(|b| b < 1) {
            return Err(LogOptionsError(
                "limitBytes: Invalid value: must be greater than 0".into(),
            ));
        }
        if self.since_seconds.is_some_and(|s| s < 1) {
            return Err(LogOptionsError(
                "sinceSeconds: Invalid value: must be greater than 0".into(),
            ));
        }
        if self.since_seconds.is_some() && self.since_time.is_some() {
            return Err(LogOptionsError(
                "at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checklist_60_61_options_are_parsed() {
        let o = LogOptions::from_query(Some(
            "follow=true&previous=1&timestamps=true&tailLines=10&limitBytes=5&sinceSeconds=30",
        ))
        .unwrap();
        assert_eq!(
            o,
            LogOptions {
                follow: true,
                previous: true,
                timestamps: true,
                since_seconds: Some(30),
                since_time: None,
                tail_lines: Some(10),
                limit_bytes: Some(5)
            }
        );
        let o = LogOptions::from_query(Some("sinceTime=2026-11-22T10%3A00%3A00Z")).unwrap();
        assert_eq!(o.since_time.as_deref(), Some("2026-11-22T10:00:00Z"));
    }

    #[test]
    fn checklist_61_62_bad_values_are_refused() {
        for q in [
            "tailLines=-1",
            "limitBytes=0",
            "sinceSeconds=0",
            "sinceSeconds=5&sinceTime=2026-11-22T10:00:00Z",
            "follow=maybe",
            "tailLines=ten",
            "sinceTime=yesterday",
        ] {
            assert!(LogOptions::from_query(Some(q)).is_err(), "{q}");
        }
        assert_eq!(LogOptions::from_query(None).unwrap(), LogOptions::default());
    }
}
