//! The duration syntax of rlark's flags (`--node-grace-period 40s`) and configuration files
//! (`rlark embodied`'s `watchdog: 2s`).

use std::time::Duration;

/// `500ms`, `2s`, `1.5s`, `3m`, `1h`, or a bare number of seconds; must be positive and
/// below 10⁹ seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 2s, 500ms, 1m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {text:?}: use ms, s, m or h"
            ));
        }
    };
    // The upper bound keeps `Duration::from_secs_f64` from overflowing (it would panic).
    if !(seconds.is_finite() && seconds > 0.0 && seconds < 1e9) {
        return Err(format!("duration {text:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Moved from the CLI's controller_manager.rs (the flags' parser); the
    // embodied configuration's cases are in rlark-embodied's `load::tests::durations`.
    #[test]
    fn durations() {
        assert_eq!(parse_duration("40s"), Ok(Duration::from_secs(40)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn huge_durations_are_refused_not_a_panic() {
        assert!(parse_duration("99999999999999999999999").is_err());
        assert!(parse_duration("1e30").is_err());
        assert!(parse_duration("300000h").is_err());
    }
}
