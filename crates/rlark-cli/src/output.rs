//! `-o jsonpath=TEMPLATE` and `-o custom-columns=SPEC` of `rlark get`, as kubectl's: the
//! path expressions are the API server's JSONPath subset
//! (`rlark_apiserver::jsonpath`, the one printer columns use).

use anyhow::Context as _;
use rlark_apiserver::jsonpath::{JsonPath, JsonPathError};
use serde_json::Value;

/// `-o json|yaml` of the listing commands that are not `get` (robots, cameras).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DataFormat {
    Json,
    Yaml,
}

/// `value` on stdout as pretty JSON or YAML.
pub(crate) fn print_data(value: &Value, format: DataFormat) -> anyhow::Result<()> {
    match format {
        DataFormat::Json => println!("{}", serde_json::to_string_pretty(value)?),
        DataFormat::Yaml => print!("{}", serde_saphyr::to_string(value).context("render YAML")?),
    }
    Ok(())
}

/// A bad `-o` template or column spec.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutputError {
    #[error("jsonpath template {template:?}: {message}")]
    Template { template: String, message: String },
    #[error("jsonpath template {template:?}: {source}")]
    Path {
        template: String,
        source: JsonPathError,
    },
    #[error(
        "custom-columns {spec:?}: {column:?} is not HEADER:JSONPATH \
         (e.g. NAME:.metadata.name,PHASE:.status.phase)"
    )]
    Column { spec: String, column: String },
    #[error("custom-columns {spec:?}: {source}")]
    ColumnPath { spec: String, source: JsonPathError },
}

/// A parsed `-o jsonpath=` template: text, `{PATH}`, `{"literal"}` and
/// `{range PATH}...{end}`, as kubectl's (other template functions are refused).
#[derive(Debug, Clone)]
pub(crate) struct Template {
    nodes: Vec<Node>,
}

#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Path(JsonPath),
    Range(JsonPath, Vec<Node>),
}

impl Template {
    pub(crate) fn parse(template: &str) -> Result<Template, OutputError> {
        let error = |message: &str| OutputError::Template {
            template: template.to_string(),
            message: message.to_string(),
        };
        // The template's top-level nodes, and the open `{range}`s: their path and the nodes
        // collected so far (the innermost last).
        let mut root: Vec<Node> = Vec::new();
        let mut ranges: Vec<(JsonPath, Vec<Node>)> = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                push_text(innermost(&mut root, &mut ranges), rest);
                break;
            };
            push_text(innermost(&mut root, &mut ranges), &rest[..open]);
            let close = action_end(&rest[open..]).ok_or_else(|| error("unclosed '{'"))?;
            let action = rest[open + 1..open + close].trim();
            rest = &rest[open + close + 1..];
            if let Some(literal) = action.strip_prefix('"') {
                let literal = literal
                    .strip_suffix('"')
                    .ok_or_else(|| error("unterminated string literal"))?;
                innermost(&mut root, &mut ranges).push(Node::Text(unescape(literal)));
            } else if action == "end" {
                let (path, body) = ranges.pop().ok_or_else(|| error("{end} without {range}"))?;
                innermost(&mut root, &mut ranges).push(Node::Range(path, body));
            } else if let Some(path) = action.strip_prefix("range ") {
                let path = parse_path(template, path)?;
                ranges.push((path, Vec::new()));
            } else {
                let path = parse_path(template, action)?;
                innermost(&mut root, &mut ranges).push(Node::Path(path));
            }
        }
        if !ranges.is_empty() {
            return Err(error("{range} without {end}"));
        }
        Ok(Template { nodes: root })
    }

    /// The template applied to `value`. Several matches of one path are joined by a
    /// space; strings print as they are, other values as JSON.
    pub(crate) fn render(&self, value: &Value) -> String {
        let mut out = String::new();
        render(&self.nodes, value, &mut out);
        out
    }
}

/// The nodes of the innermost open `{range}`, or the top level.
fn innermost<'a>(
    root: &'a mut Vec<Node>,
    ranges: &'a mut [(JsonPath, Vec<Node>)],
) -> &'a mut Vec<Node> {
    match ranges.last_mut() {
        Some((_, nodes)) => nodes,
        None => root,
    }
}

fn push_text(nodes: &mut Vec<Node>, text: &str) {
    if !text.is_empty() {
        nodes.push(Node::Text(text.to_string()));
    }
}

/// Offset of the `}` closing the action `s` starts with (`{`), quotes respected.
fn action_end(s: &str) -> Option<usize> {
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match (quote, c) {
            (_, _) if escaped => escaped = false,
            (_, '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '}') => return Some(i),
            (None, _) => {}
        }
    }
    None
}

fn unescape(literal: &str) -> String {
    let mut out = String::new();
    let mut chars = literal.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

fn parse_path(template: &str, path: &str) -> Result<JsonPath, OutputError> {
    // `{@}` / `{@.x}` in a range: the current element, as `.` / `.x`.
    let path = path.trim();
    let path = match path.strip_prefix('@') {
        Some("") => "$",
        Some(rest) => rest,
        None => path,
    };
    let parsed = if path == "$" || path == "." {
        JsonPath::parse("$")
    } else {
        JsonPath::parse(path)
    };
    parsed.map_err(|source| OutputError::Path {
        template: template.to_string(),
        source,
    })
}

fn render(nodes: &[Node], value: &Value, out: &mut String) {
    for node in nodes {
        match node {
            Node::Text(text) => out.push_str(text),
            Node::Path(path) => {
                let values: Vec<String> = path.all(value).into_iter().map(plain).collect();
                out.push_str(&values.join(" "));
            }
            Node::Range(path, body) => {
                for item in path.all(value) {
                    render(body, item, out);
                }
            }
        }
    }
}

/// A value as `-o jsonpath` and custom columns print it.
fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `-o custom-columns=HEADER:PATH,...`.
#[derive(Debug, Clone)]
pub(crate) struct CustomColumns {
    columns: Vec<(String, JsonPath)>,
}

impl CustomColumns {
    pub(crate) fn parse(spec: &str) -> Result<CustomColumns, OutputError> {
        let mut columns = Vec::new();
        for column in spec.split(',') {
            let Some((header, path)) = column.split_once(':') else {
                return Err(OutputError::Column {
                    spec: spec.to_string(),
                    column: column.to_string(),
                });
            };
            if header.trim().is_empty() || path.trim().is_empty() {
                return Err(OutputError::Column {
                    spec: spec.to_string(),
                    column: column.to_string(),
                });
            }
            let path = JsonPath::parse(path).map_err(|source| OutputError::ColumnPath {
                spec: spec.to_string(),
                source,
            })?;
            columns.push((header.trim().to_string(), path));
        }
        Ok(CustomColumns { columns })
    }

    /// The objects as a table, a row each: every match of a column's path, joined by
    /// commas, or `<none>`.
    pub(crate) fn render(&self, objects: &[Value], no_headers: bool) -> String {
        let mut lines = Vec::new();
        if !no_headers {
            lines.push(self.columns.iter().map(|(h, _)| h.clone()).collect());
        }
        for object in objects {
            lines.push(
                self.columns
                    .iter()
                    .map(|(_, path)| {
                        let values: Vec<String> = path.all(object).into_iter().map(plain).collect();
                        if values.is_empty() {
                            "<none>".to_string()
                        } else {
                            values.join(",")
                        }
                    })
                    .collect(),
            );
        }
        super::table::align(&lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!({"kind": "List", "items": [
            {"metadata": {"name": "a", "labels": {"app": "x"}}, "status": {"phase": "Running"}, "spec": {"replicas": 2}},
            {"metadata": {"name": "b"}, "spec": {"replicas": 1}},
        ]})
    }

    #[test]
    fn templates_render_as_kubectl() {
        for (template, expected) in [
            ("{.items[*].metadata.name}", "a b"),
            ("{.items[0].spec.replicas}", "2"),
            (
                "{range .items[*]}{.metadata.name}={.spec.replicas}{\"\\n\"}{end}",
                "a=2\nb=1\n",
            ),
            ("names: {.items[*].metadata.name}!", "names: a b!"),
            (
                "{.items[?(@.metadata.name==\"b\")].spec}",
                "{\"replicas\":1}",
            ),
            ("{.items[1].status.phase}", ""),
            ("{range .items[*]}[{@.metadata.name}]{end}", "[a][b]"),
            ("{.kind}", "List"),
        ] {
            let parsed = Template::parse(template).unwrap_or_else(|e| panic!("{template}: {e}"));
            assert_eq!(parsed.render(&list()), expected, "{template}");
        }
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        for (template, message) in [
            ("{.items", "jsonpath template \"{.items\": unclosed '{'"),
            (
                "{range .items[*]}x",
                "jsonpath template \"{range .items[*]}x\": {range} without {end}",
            ),
            (
                "x{end}",
                "jsonpath template \"x{end}\": {end} without {range}",
            ),
            (
                "{\"x\"y}",
                "jsonpath template \"{\\\"x\\\"y}\": unterminated string literal",
            ),
        ] {
            let error = Template::parse(template).expect_err(template).to_string();
            assert_eq!(error, message);
        }
        let error = Template::parse("{..name}")
            .expect_err("recursive descent")
            .to_string();
        assert!(
            error.starts_with("jsonpath template \"{..name}\": "),
            "{error}"
        );
    }

    #[test]
    fn custom_columns_are_a_table() {
        let columns = CustomColumns::parse(
            "NAME:.metadata.name,PHASE:.status.phase,APP:.metadata.labels.app",
        )
        .expect("parse");
        let items = list()["items"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            columns.render(&items, false),
            "NAME      PHASE     APP\na         Running   x\nb         <none>    <none>\n"
        );
        assert_eq!(
            columns.render(&items, true),
            "a         Running   x\nb         <none>    <none>\n"
        );
        let error = CustomColumns::parse("NAME")
            .expect_err("no path")
            .to_string();
        assert_eq!(
            error,
            "custom-columns \"NAME\": \"NAME\" is not HEADER:JSONPATH (e.g. NAME:.metadata.name,PHASE:.status.phase)"
        );
    }
}
