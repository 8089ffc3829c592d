//! In-process CPU cost of the per-request steps of a create that can be timed from outside
//! the server: what part of the API path's overhead over the store they explain.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::object;

/// Mean CPU time of each step for one benchmark object, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CreateStepCosts {
    /// `serde_json::from_slice` of the request body into a JSON value.
    pub parse_us: f64,
    /// `rlark_api::validation::validate("Job", ..)`: typed decode plus semantic checks.
    pub validate_us: f64,
    /// A deep clone of the parsed value.
    pub clone_us: f64,
    /// `serde_json::to_vec` of the value (the response body; the store encodes it again).
    pub encode_us: f64,
    /// Iterations each mean is taken over.
    pub iterations: usize,
}

impl CreateStepCosts {
    /// Sum of the steps.
    pub fn total_us(&self) -> f64 {
        self.parse_us + self.validate_us + self.clone_us + self.encode_us
    }
}

fn mean_us(iterations: usize, mut step: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iterations {
        step();
    }
    per_iteration_us(start.elapsed(), iterations)
}

fn per_iteration_us(total: Duration, iterations: usize) -> f64 {
    total.as_secs_f64() * 1e6 / iterations.max(1) as f64
}

/// Time each step `iterations` times on the benchmark object (single thread).
pub fn create_step_costs(iterations: usize) -> CreateStepCosts {
    let body = object::job_bytes("bench-micro-000000", "micro");
    let value = object::job("bench-micro-000000", "micro");
    CreateStepCosts {
        parse_us: mean_us(iterations, || {
            let parsed: Result<serde_json::Value, _> = serde_json::from_slice(black_box(&body));
            black_box(parsed.ok());
        }),
        validate_us: mean_us(iterations, || {
            black_box(rlark_api::validation::validate("Job", black_box(&value)).is_ok());
        }),
        clone_us: mean_us(iterations, || {
            black_box(black_box(&value).clone());
        }),
        encode_us: mean_us(iterations, || {
            black_box(serde_json::to_vec(black_box(&value)).ok());
        }),
        iterations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_timed() {
        let costs = create_step_costs(3);
        assert_eq!(costs.iterations, 3);
        assert!(costs.parse_us > 0.0 && costs.validate_us > 0.0);
        assert!(
            (costs.total_us()
                - (costs.parse_us + costs.validate_us + costs.clone_us + costs.encode_us))
                .abs()
                < 1e-9
        );
        assert_eq!(per_iteration_us(Duration::from_millis(3), 3), 1000.0);
    }
}
