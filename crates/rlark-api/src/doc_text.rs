//! Rustdoc comments turned into text for people: the CRD schema descriptions that
//! `kubectl explain` shows come from the types' `///` comments (via schemars), where
//! intra-doc links such as ``[`TaskSpec`]`` or ``[`super::JobPhase`]`` mean nothing.

/// `text` with rustdoc intra-doc links replaced by the item's name:
/// ``[`X`]`` → `X`, ``[`X`](path)`` and ``[`X`][ref]`` → `X`, ``[`super::X`]`` → `X`
/// (module paths dropped, `Type::item` kept), and `[words](crate::path)` → `words`.
/// Ordinary Markdown links to URLs and lone brackets are left as they are.
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        match link(after) {
            Some((name, used)) => {
                out.push_str(&name);
                rest = &after[used..];
            }
            None => {
                out.push('[');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The rustdoc link at the start of `s` (which starts with `[`): the text to show and
/// how many bytes of `s` it spans; `None` when `s` does not start with one.
fn link(s: &str) -> Option<(String, usize)> {
    if let Some(inner) = s.strip_prefix("[`") {
        let close = inner.find("`]")?;
        let item = &inner[..close];
        if item.is_empty() || item.contains(['`', '[', ']', '\n']) {
            return None;
        }
        let mut used = 2 + close + 2;
        let tail = &s[used..];
        // `[`X`](path)` or `[`X`][ref]`: the target goes too.
        if let Some(target) = tail.strip_prefix('(')
            && let Some(end) = target.find(')')
            && !target[..end].contains(char::is_whitespace)
        {
            used += end + 2;
        } else if let Some(target) = tail.strip_prefix('[')
            && let Some(end) = target.find(']')
            && !target[..end].contains(char::is_whitespace)
        {
            used += end + 2;
        }
        return Some((item_name(item), used));
    }
    // `[words](crate::path)`: a link to an item under other words.
    let inner = &s[1..];
    let close = inner.find("](")?;
    let words = &inner[..close];
    let target = &inner[close + 2..];
    let end = target.find(')')?;
    let path = &target[..end];
    let is_item = ["crate::", "super::", "self::"]
        .iter()
        .any(|p| path.starts_with(p));
    if words.is_empty() || words.contains(['[', ']', '\n']) || !is_item {
        return None;
    }
    Some((words.to_string(), 1 + close + 2 + end + 1))
}

/// `super::JobPhase` → `JobPhase`, `crate::types::Job::spec` → `Job::spec`,
/// `crate::defaults` → `defaults`: the path without its modules.
fn item_name(path: &str) -> String {
    let segments: Vec<&str> = path.split("::").collect();
    let first_kept = segments
        .iter()
        .position(|s| s.starts_with(|c: char| c.is_ascii_uppercase()))
        .unwrap_or(segments.len() - 1);
    segments[first_kept..].join("::")
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn intra_doc_links_become_names() {
        for (input, expected) in [
            ("a [`TaskSpec`] inline", "a TaskSpec inline"),
            ("see [`super::JobPhase`]).", "see JobPhase)."),
            ("[`crate::types::Job::spec`]", "Job::spec"),
            ("[`crate::defaults`] block", "defaults block"),
            ("[`TaskSpec::input_env`]", "TaskSpec::input_env"),
            ("the [`Job`](crate::types::Job) kind", "the Job kind"),
            ("the [`Job`][job] kind", "the Job kind"),
            (
                "the [defaults](crate::defaults) block",
                "the defaults block",
            ),
            ("[`A`] and [`b::C`]", "A and C"),
        ] {
            assert_eq!(plain(input), expected, "{input}");
        }
    }

    #[test]
    fn other_brackets_stay() {
        for input in [
            "a list [1, 2] here",
            "see [the docs](https://example.org/x)",
            "unclosed [`X and more",
            "`[`",
            "[]",
            "x[",
            "nodes [`a` `b`]",
            "ends with [",
        ] {
            assert_eq!(plain(input), input);
        }
    }
}
