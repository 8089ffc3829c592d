//! Why a template fits nowhere, in words: the `Unschedulable` message of one template
//! (its exclusions, per cluster what is short, and for what no Node of the installation
//! could satisfy, what would: [`Want::remedies`]), and the formatting of resources and
//! selectors the messages share.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kube::ResourceExt as _;
use rlark_api::labels;
use rlark_api::quantity::QuantityValue;

use super::{
    CLONESET_API, Exclusion, NodeUse, Resources, Unschedulable, Want, World, free,
    selector_matches, slots,
};

impl Want<'_> {
    /// Explains why the template fits in no cluster given `state` (`initial`: the state
    /// before this Job's templates took anything).
    pub(super) fn explain(
        &self,
        world: &World<'_>,
        state: &[NodeUse],
        initial: &[NodeUse],
    ) -> Unschedulable {
        let name = &self.template.name;
        let mut msg = format!(
            "task {name:?} ({} {}) does not fit: ",
            self.replicas,
            plural(self.replicas, "replica", "replicas")
        );
        let wanted: Resources = self
            .requests
            .iter()
            .filter(|(_, v)| !v.is_zero())
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let mut parts: Vec<String> = Vec::new();
        if world.nodes.is_empty() {
            parts.push("no Nodes are registered".into());
        } else if self.eligible.is_empty() {
            parts.push("no eligible Node".into());
        } else {
            if wanted.is_empty() {
                parts.push("needs no resources".into());
            } else {
                parts.push(format!("needs {} per replica", format_resources(&wanted)));
            }
            let mut fits_before = true;
            for (cluster, nodes) in &self.eligible {
                let fit: usize = nodes
                    .iter()
                    .map(|&i| slots(&world.nodes[i].total, &state[i], &wanted, self.replicas))
                    .sum::<usize>()
                    .min(self.replicas);
                let before: usize = nodes
                    .iter()
                    .map(|&i| slots(&world.nodes[i].total, &initial[i], &wanted, self.replicas))
                    .sum();
                fits_before &= before >= self.replicas;
                let mut shortages = Vec::new();
                for (resource, amount) in &wanted {
                    let one: Resources = [(resource.clone(), *amount)].into();
                    let by_resource: usize = nodes
                        .iter()
                        .map(|&i| slots(&world.nodes[i].total, &state[i], &one, self.replicas))
                        .sum();
                    if by_resource < self.replicas {
                        let mut sum = QuantityValue::ZERO;
                        for &i in nodes {
                            let f = free(&world.nodes[i].total, &state[i], resource);
                            sum = sum.checked_add(f).unwrap_or(sum.max(f));
                        }
                        shortages.push(format!(
                            "{resource}: {} free",
                            format_quantity(resource, sum)
                        ));
                    }
                }
                let why = if shortages.is_empty() {
                    "resources are free but not together on the same nodes".to_string()
                } else {
                    shortages.join(", ")
                };
                parts.push(format!(
                    "cluster {cluster:?} fits {fit} ({why} on {} eligible {})",
                    nodes.len(),
                    plural(nodes.len(), "node", "nodes")
                ));
            }
            if fits_before {
                parts.push("the Job's other tasks take the rest (all are placed together)".into());
            }
        }
        if let Some(pin) = &self.template.spec.node_name
            && !world.nodes.iter().any(|f| &f.name == pin)
        {
            parts.push(format!("nodeName {pin:?} is not a registered Node"));
        }
        let excluded: Vec<String> = self
            .excluded
            .iter()
            .map(|(why, &n)| {
                let nodes = format!("{n} {}", plural(n, "node", "nodes"));
                let spec = &self.template.spec;
                match why {
                    Exclusion::Identity => format!(
                        "{nodes} excluded because {} does not match the agent namespace",
                        labels::CLUSTER_ID
                    ),
                    Exclusion::NotPinned => format!(
                        "{nodes} excluded by nodeName {:?}",
                        spec.node_name.as_deref().unwrap_or_default()
                    ),
                    Exclusion::AgentType => {
                        format!("{nodes} excluded by agent type (needs {})", spec.agent_type)
                    }
                    Exclusion::WorkloadKind => format!(
                        "{nodes} excluded because their member cluster does not serve \
                         {CLONESET_API} CloneSet"
                    ),
                    Exclusion::Selector => format!(
                        "{nodes} excluded by nodeSelector {}",
                        format_selector(&spec.node_selector)
                    ),
                    Exclusion::NameOwner => format!(
                        "{nodes} excluded because another cluster's Node holds the name (Node names resolve to the cluster that registered them first)"
                    ),
                    Exclusion::Offline => format!("{nodes} offline"),
                    Exclusion::Cordoned => format!("{nodes} cordoned"),
                }
            })
            .collect();
        if !excluded.is_empty() {
            parts.push(excluded.join(", "));
        }
        parts.extend(self.remedies(world));
        msg.push_str(&parts.join("; "));
        Unschedulable {
            task: name.clone(),
            message: msg,
        }
    }

    /// What would make the template placeable, for what no agent's Node of the
    /// installation satisfies (Nodes no agent can be do not count): no Node of its agent
    /// type at all, a `nodeSelector` label no Node has (a cluster ID no agent joined as, a
    /// host name no agent reports).
    fn remedies(&self, world: &World<'_>) -> Vec<String> {
        let spec = &self.template.spec;
        let mut out = Vec::new();
        let agents = || world.nodes.iter().filter(|f| !f.untrusted);
        if self.excluded.contains_key(&Exclusion::AgentType)
            && !agents().any(|f| f.node.spec.agent_type == spec.agent_type)
        {
            out.push(format!(
                "no agent runs {0} tasks: join one with `rlark agent --agent-type {0} ...` \
                 (a bootstrap token from `rlark token create --cluster-id ID`)",
                spec.agent_type
            ));
        }
        if self.excluded.contains_key(&Exclusion::WorkloadKind)
            && !agents().any(|f| {
                f.node
                    .labels()
                    .get(labels::SERVES_CLONESET)
                    .map(String::as_str)
                    == Some("true")
            })
        {
            out.push(format!(
                "no member cluster serves OpenKruise's CloneSet ({CLONESET_API}): install \
                 OpenKruise on one and restart its agent (it looks for the CRD when it \
                 starts), or use kind Deployment"
            ));
        }
        // Said whatever excluded the Nodes first: a Job for a cluster no agent joined as
        // needs that agent, whichever runtime is missing too.
        for (key, value) in &spec.node_selector {
            let one = BTreeMap::from([(key.clone(), value.clone())]);
            let held = agents().any(|f| selector_matches(&one, f.node.labels(), &f.cluster));
            if held {
                continue;
            }
            out.push(if key == labels::CLUSTER_ID {
                format!(
                    "no Node has {key}={value}: no agent joined as cluster {value:?} \
                     (`rlark token create --cluster-id {value}`, then `rlark agent` with it)"
                )
            } else if key == labels::HOSTNAME {
                format!("no Node has {key}={value}: no agent reports a Node named {value:?}")
            } else {
                format!("no Node has {key}={value} (label a Node with it, or change the selector)")
            });
        }
        out
    }
}

fn plural<'s>(n: usize, one: &'s str, many: &'s str) -> &'s str {
    if n == 1 { one } else { many }
}

/// `cpu=500m, memory=2Gi, nvidia.com/gpu=1`.
pub fn format_resources(resources: &Resources) -> String {
    resources
        .iter()
        .map(|(name, value)| format!("{name}={}", format_quantity(name, *value)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A quantity the way people write it: `500m` for fractions, binary suffixes for whole
/// multiples of 1024 of memory-like resources (`2Gi`), plain integers otherwise.
pub fn format_quantity(resource: &str, value: QuantityValue) -> String {
    if value.exponent() >= 0 {
        let Some(n) = value.value() else {
            return value.to_string();
        };
        let memory_like = ["memory", "storage"].iter().any(|k| resource.contains(k));
        if memory_like && n != 0 {
            for (suffix, bits) in [
                ("Ei", 60),
                ("Pi", 50),
                ("Ti", 40),
                ("Gi", 30),
                ("Mi", 20),
                ("Ki", 10),
            ] {
                let unit = 1i128 << bits;
                if n % unit == 0 {
                    return format!("{}{suffix}", n / unit);
                }
            }
        }
        return n.to_string();
    }
    if value.exponent() >= -3
        && let Some(milli) = value.milli_value()
    {
        return format!("{milli}m");
    }
    value.to_string()
}

fn format_selector(selector: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (i, (k, v)) in selector.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}={}", v.replace(',', "|"));
    }
    out
}
