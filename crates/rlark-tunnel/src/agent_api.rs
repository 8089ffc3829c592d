//! The agent's local API as both ends speak it: the hub's routes forward requests for it
//! over `agent-api` streams, the agent serves them. Only the request vocabulary lives here
//! (pure parsing); the agent's server is `rlark_agent::api`, the hub's route
//! `rlark-server/src/tunnel/logs.rs`.

/// Path of a replica's log on the agent's local API.
pub fn logs_path(namespace: &str, pod: &str) -> String {
    format!("/logs/{namespace}/{pod}")
}

/// Parameters of `GET /logs/...`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Start at the N-th line from the end (`tail`).
    pub tail: Option<u64>,
    /// Keep sending appended bytes until the replica exits (`follow`).
    pub follow: bool,
    /// The run before the current one (`previous`).
    pub previous: bool,
    /// Stop after this many bytes (`limitBytes`).
    pub limit_bytes: Option<u64>,
}

impl LogOptions {
    /// Parse a query string (`tail` (alias `tailLines`, kubectl's name), `follow`, `previous`, `limitBytes`; other parameters
    /// are ignored). Booleans are `true`/`false`/`1`/`0`; numbers are non-negative integers
    /// (`limitBytes` at least 1).
    pub fn parse(query: Option<&str>) -> Result<LogOptions, String> {
        let mut options = LogOptions::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "tail" | "tailLines" => options.tail = Some(parse_number(key, value)?),
                "follow" => options.follow = parse_bool(key, value)?,
                "previous" => options.previous = parse_bool(key, value)?,
                "limitBytes" => {
                    let n = parse_number(key, value)?;
                    if n == 0 {
                        return Err("limitBytes must be at least 1".into());
                    }
                    options.limit_bytes = Some(n);
                }
                _ => {}
            }
        }
        Ok(options)
    }

    /// The query string of these options (no leading `?`; empty for the defaults).
    pub fn to_query(&self) -> String {
        let mut parts = Vec::new();
        if let Some(tail) = self.tail {
            parts.push(format!("tail={tail}"));
        }
        if self.follow {
            parts.push("follow=true".to_string());
        }
        if self.previous {
            parts.push("previous=true".to_string());
        }
        if let Some(limit) = self.limit_bytes {
            parts.push(format!("limitBytes={limit}"));
        }
        parts.join("&")
    }
}

fn parse_number(key: &str, value: &str) -> Result<u64, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{key}={value:?} is not a non-negative integer"));
    }
    value
        .parse()
        .map_err(|_| format!("{key}={value:?} is too large"))
}

fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("{key}={value:?} is not true or false")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_print() {
        assert_eq!(LogOptions::parse(None), Ok(LogOptions::default()));
        let options =
            LogOptions::parse(Some("tail=3&follow=true&previous=0&limitBytes=10&x=y")).unwrap();
        assert_eq!(
            options,
            LogOptions {
                tail: Some(3),
                follow: true,
                previous: false,
                limit_bytes: Some(10),
            }
        );
        assert_eq!(options.to_query(), "tail=3&follow=true&limitBytes=10");
        for bad in ["tail=-1", "tail=x", "follow=yes", "limitBytes=0", "tail=+1"] {
            assert!(LogOptions::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn kubectl_names_are_accepted_and_passed_on_canonically() {
        let q = LogOptions::parse(Some("tailLines=5&follow=1&previous=false&limitBytes=9&x=1"))
            .unwrap();
        assert_eq!(q.to_query(), "tail=5&follow=true&limitBytes=9");
        assert_eq!(LogOptions::parse(None).unwrap().to_query(), "");
        for bad in ["tail=-2", "follow=maybe", "limitBytes=0", "tail="] {
            assert!(LogOptions::parse(Some(bad)).is_err(), "{bad}");
        }
    }
}
