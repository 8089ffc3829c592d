//! A Task's `kubernetes.jobTemplate`: MiniJinja rendering, YAML parsing, the batch/v1 Job
//! checks and the forced fields. The body is `rlark_agent::fuzzing::job_template`, which
//! `cargo test -p rlark-agent` also runs over deterministic mutations.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rlark_agent::fuzzing::job_template(data);
});
