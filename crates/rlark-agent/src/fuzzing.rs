//! Fuzz target bodies over the agent's parsers of untrusted input (Job templates), as
//! plain functions: the cargo-fuzz targets in `fuzz/` (nightly, libFuzzer) call them, and
//! so do this crate's stable mutation tests. Not an API: compiled for tests and with the
//! `fuzzing` feature only. The IP packet target is in rlark-net (`rlark_net::fuzzing`).
// A fuzz target states its invariants as panics: that is how the fuzzer reports them.
#![allow(clippy::expect_used, clippy::unwrap_used)]

/// A Task's `kubernetes.jobTemplate` (text written by any user who may create Tasks):
/// rendering and parsing never panic, every refusal has a message, and a template that
/// gives a Job gives one with rlark's forced fields (backoffLimit 0, restartPolicy Never,
/// the Task's name). Returns whether a Job came out.
pub fn job_template(data: &[u8]) -> bool {
    use crate::kubernetes::{MemberContext, template};
    let text = String::from_utf8_lossy(data);
    let mut spec: rlark_api::types::TaskSpec = serde_json::from_value(serde_json::json!({
        "agentType": "Kubernetes", "role": "Rollout",
        "placement": {"clusterID": "c1", "nodes": ["n1"]},
        "input": {"question": "2+2", "n": 3, "list": [1, 2]},
    }))
    .expect("fixed task spec");
    spec.kubernetes = Some(rlark_api::types::KubernetesTaskSpec {
        job_template: Some(text.into_owned()),
        ..Default::default()
    });
    let mut task = rlark_api::types::Task::new("fuzz-task", spec);
    task.metadata.namespace = Some("rlark-c1".into());
    task.metadata.uid = Some("uid-1".into());
    let ctx = MemberContext {
        cluster_id: "c1".into(),
        namespace: "rlark-system".into(),
        ..Default::default()
    };
    match template::render(&task, &ctx) {
        Ok(rendered) => {
            let spec = rendered.job.spec.expect("a rendered Job has a spec");
            assert_eq!(spec.backoff_limit, Some(0));
            let pod = spec.template.spec.expect("a rendered Job has a pod");
            assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
            assert_eq!(rendered.job.metadata.name.as_deref(), Some("fuzz-task"));
            true
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            false
        }
    }
}

/// Runs [`job_template`] over `rounds` deterministic mutations of valid and nearly valid
/// templates. Returns how many gave a Job and how many were refused.
pub fn mutate_job_templates(rounds: usize) -> (usize, usize) {
    let seeds: [&[u8]; 3] = [
        b"apiVersion: batch/v1\nkind: Job\nmetadata: {name: {{ job_name }}}\nspec:\n  template:\n    spec:\n      containers:\n        - name: a\n          image: x\n          env:\n            - {name: Q, value: {{ input.question | yaml_escape }}}\n",
        b"apiVersion: batch/v1\nkind: Job\nspec:\n  backoffLimit: 3\n  template:\n    spec:\n      restartPolicy: OnFailure\n      containers:\n{% for i in input.list %}        - {name: c{{ i }}, image: x}\n{% endfor %}",
        b"{% if task.name %}apiVersion: batch/v1\nkind: Job\n---\nkind: Job\n{% endif %}",
    ];
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let (mut accepted, mut refused) = (0, 0);
    for round in 0..rounds {
        let input = rng.mutate(seeds[round % seeds.len()]);
        if job_template(&input) {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    (accepted, refused)
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut data = seed.to_vec();
        for _ in 0..=self.below(3) {
            match self.below(5) {
                0 if !data.is_empty() => {
                    let i = self.below(data.len());
                    data[i] ^= 1 << self.below(8);
                }
                1 if !data.is_empty() => data.truncate(self.below(data.len())),
                2 => {
                    let i = self.below(data.len() + 1);
                    data.insert(i, self.next() as u8);
                }
                3 if !data.is_empty() => {
                    let i = self.below(data.len());
                    data.remove(i);
                }
                _ if !data.is_empty() => {
                    // Interesting bytes: versions, header lengths, protocol numbers,
                    // ICMP types, fragment flags, lengths.
                    let i = self.below(data.len());
                    data[i] =
                        [0, 1, 6, 8, 17, 0x20, 0x3a, 0x45, 0x60, 0x80, 0x81, 0xff][self.below(12)];
                }
                _ => {}
            }
        }
        data
    }
}
